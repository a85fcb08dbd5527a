"""Captures a profile from a running profiler server with TensorBoard's own capture client
(xprof's `_pywrap_profiler_plugin.trace`: the call its *Capture Profile* dialog makes), then
converts what it wrote with xprof's tools, as TensorBoard would show it.

usage: capture_with_xprof.py grpc://host:port <logdir>
"""

import glob
import os
import sys

from xprof.convert import _pywrap_profiler_plugin, raw_to_tool_data


def main():
    service_addr, logdir = sys.argv[1], sys.argv[2]
    # As the dialog calls it: address without the scheme, no worker list, dataset ops on,
    # 1 s, 3 attempts, the default tracer levels.
    _pywrap_profiler_plugin.trace(
        service_addr.removeprefix("grpc://"),
        logdir,
        "",
        True,
        1000,
        3,
        {"host_tracer_level": 2, "device_tracer_level": 1, "python_tracer_level": 0},
    )
    planes = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    print("written:", planes)
    if len(planes) != 1:
        sys.exit(f"expected one .xplane.pb, found {planes}")
    for tool in ["trace_viewer", "overview_page", "framework_op_stats"]:
        data, _ = raw_to_tool_data.xspace_to_tool_data(planes, tool, {})
        if not data:
            sys.exit(f"xprof's {tool} is empty for the captured profile")
        print(tool, "ok:", len(data), "bytes")


if __name__ == "__main__":
    main()
