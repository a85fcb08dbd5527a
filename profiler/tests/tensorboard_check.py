"""Reads a ferroflow log directory with TensorBoard's own readers (tensorboard, xprof).

Usage: tensorboard_check.py LOGDIR EXPECTED.json
EXPECTED: {"scalars": {"train": {"epoch_loss": [[step, value], ...]}, "validation": {...}},
           "histogram_tags": [...], "profile_run": "train", "op_types": ["Conv2D", ...],
           "steps": N}
Prints one line per check; exits non-zero on the first failure.
"""
import glob
import json
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main():
    logdir, expected_path = sys.argv[1], sys.argv[2]
    expected = json.load(open(expected_path))
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea

    for run, tags in expected["scalars"].items():
        acc = pea.EventAccumulator(os.path.join(logdir, run), size_guidance={"tensors": 0})
        acc.Reload()
        have = acc.Tags()["tensors"]
        for tag, points in tags.items():
            if tag not in have:
                fail(f"{run}: TensorBoard sees no {tag!r} (it sees {sorted(have)})")
            events = acc.Tensors(tag)
            from tensorboard.util import tensor_util
            got = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events]
            if len(got) != len(points):
                fail(f"{run}/{tag}: {len(got)} values, expected {len(points)}")
            for (gs, gv), (es, ev) in zip(got, points):
                if gs != es or not math.isclose(gv, ev, rel_tol=1e-6, abs_tol=1e-7):
                    fail(f"{run}/{tag}: got step {gs} value {gv}, expected step {es} value {ev}")
            # The legacy loader too (the scalars dashboard's first reader).
            old = ea.EventAccumulator(os.path.join(logdir, run), size_guidance={"tensors": 0})
            old.Reload()
            if tag not in old.Tags()["tensors"]:
                fail(f"{run}: the legacy EventAccumulator sees no {tag!r}")
        print(f"ok: {run}: {len(tags)} scalar tags match ({sum(len(p) for p in tags.values())} values)")
    if expected.get("histogram_tags"):
        acc = pea.EventAccumulator(os.path.join(logdir, "train"), size_guidance={"tensors": 0})
        acc.Reload()
        from tensorboard.util import tensor_util
        for tag in expected["histogram_tags"]:
            if tag not in acc.Tags()["tensors"]:
                fail(f"histogram {tag!r} missing")
            arr = tensor_util.make_ndarray(acc.Tensors(tag)[0].tensor_proto)
            if arr.ndim != 2 or arr.shape[1] != 3 or arr[:, 2].sum() <= 0:
                fail(f"histogram {tag!r} has shape {arr.shape}")
        print(f"ok: {len(expected['histogram_tags'])} histograms read")

    if "profile_run" not in expected:
        return
    xplanes = glob.glob(os.path.join(logdir, expected["profile_run"], "plugins/profile/*/*.xplane.pb"))
    if not xplanes:
        fail("no .xplane.pb written")
    from xprof.convert import raw_to_tool_data as r

    tools = r.xspace_to_tool_names(xplanes)
    for t in ["trace_viewer@", "overview_page", "framework_op_stats", "memory_profile", "input_pipeline_analyzer"]:
        if t not in tools:
            fail(f"xprof offers no {t} (it offers {tools})")

    def tool(name):
        data, _ = r.xspace_to_tool_data(xplanes, name, {})
        if data is None:
            fail(f"{name}: xprof produced nothing")
        if isinstance(data, bytes):
            data = data.decode()
        return data

    trace = json.loads(tool("trace_viewer"))
    names = {e.get("name") for e in trace["traceEvents"]}
    for op in expected["op_types"]:
        if not any(n and n.endswith(":" + op) or n == op for n in names):
            fail(f"trace viewer: no {op} event")
    print(f"ok: trace viewer: {len(trace['traceEvents'])} events")

    ops = json.loads(tool("framework_op_stats"))
    rows = ops[0]["rows"]
    types = {row["c"][2]["v"] for row in rows}
    for op in expected["op_types"]:
        if op not in types:
            fail(f"framework op stats: no {op} (types: {sorted(types)[:30]})")
    print(f"ok: framework op stats: {len(rows)} rows")

    pipeline = json.loads(tool("input_pipeline_analyzer"))
    step_rows = pipeline[1]["rows"]
    if len(step_rows) != expected["steps"]:
        fail(f"input pipeline / overview: {len(step_rows)} steps, expected {expected['steps']}")
    cols = [c["id"] for c in pipeline[1]["cols"]]
    infeed = sum(row["c"][cols.index("infeedTimeMs")]["v"] for row in step_rows)
    print(f"ok: step-time breakdown: {len(step_rows)} steps, input {infeed:.3f} ms in all")
    if expected.get("input_bound") and infeed <= 0:
        fail("the input-bound run shows no input time")

    overview = json.loads(tool("overview_page"))
    print("ok: overview page:", len(overview), "tables")

    mem = json.loads(tool("memory_profile"))
    per = mem.get("memoryProfilePerAllocator", {})
    if "cpu" not in per or not per["cpu"].get("memoryProfileSnapshots"):
        fail(f"memory profile: no cpu snapshots ({list(per)})")
    print(f"ok: memory profile: {len(per['cpu'].get('sampledTimelineSnapshots', []))} timeline snapshots, "
          f"peak {per['cpu'].get('profileSummary', {}).get('peakStats', {}).get('peakBytesInUse')}")


if __name__ == "__main__":
    main()
