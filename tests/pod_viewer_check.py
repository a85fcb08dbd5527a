"""Converts a multi-worker capture's xplanes with xprof's own Pod viewer tool (TensorBoard's
Profile tab, "pod_viewer") and checks that it shows every worker's steps.

usage: pod_viewer_check.py <plane.xplane.pb>...
"""

import json
import sys

from xprof.convert import raw_to_tool_data


def main():
    planes = sys.argv[1:]
    data, _ = raw_to_tool_data.xspace_to_tool_data(planes, "pod_viewer", {})
    if not data:
        sys.exit("xprof's pod_viewer is empty")
    pod = json.loads(data)
    steps = pod["podStatsSequence"]["podStatsMap"]
    cores = {c for s in steps for c in s["podStatsPerCore"]}
    print(f"pod_viewer: {len(steps)} steps, {len(cores)} workers")
    if len(cores) != len(planes):
        sys.exit(f"pod_viewer shows {len(cores)} workers for {len(planes)} profiles")
    if len(steps) < 3:
        sys.exit(f"pod_viewer shows {len(steps)} steps")
    for s in steps:
        for c in s["podStatsPerCore"].values():
            if c["totalDurationUs"] <= 0:
                sys.exit(f"a step of no time: {c}")


if __name__ == "__main__":
    main()
