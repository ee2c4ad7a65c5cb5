"""Issue 25: where one profiled step's wall time goes, per rank, from train_ddp's Chrome traces (PROFILE_STEP).

    python bench_results/issue25/step_profile.py OUTPUT_DIR [OUTPUT_DIR ...]

For each trace_step*_rank*.json: the profiled span (first to last event), the GPU's busy time (the union of its
kernels' intervals), of which NCCL kernels, and the GPU's idle time (span - busy: waiting on the CPU's launches,
on data, on the peer). The question it answers: do 2 ranks run the same kernels for longer (busy up), or leave
the GPU idle for longer (idle up) than 1 rank does?
"""

import json
import sys
from pathlib import Path


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1e6  # trace times are microseconds


def profile(trace: Path) -> dict:
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e6
    busy = union_seconds([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
    nccl = union_seconds([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()])
    return {"span": span, "busy": busy, "nccl": nccl, "kernels": len(kernels)}


def main() -> None:
    print("| trace | span s | GPU busy s | of which NCCL s | GPU idle s | idle share | kernels |")
    print("|---|---|---|---|---|---|---|")
    for folder in map(Path, sys.argv[1:]):
        for trace in sorted(folder.glob("trace_step*_rank*.json")):
            p = profile(trace)
            idle = p["span"] - p["busy"]
            print(
                f"| {folder.name}/{trace.name} | {p['span']:.3f} | {p['busy']:.3f} | {p['nccl']:.3f} | {idle:.3f} "
                f"| {idle / p['span']:.0%} | {p['kernels']:,} |"
            )


if __name__ == "__main__":
    main()
