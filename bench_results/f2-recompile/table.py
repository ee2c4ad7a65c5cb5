"""The F2 table from call.sh's output folder: per layout, the step times (first step, median, the slowest later
step, from metrics.jsonl) and the recompiles the log shows after step 1: how many before each later step or
evaluation, and the wall-clock span from the first to the last of them (dynamo's own log time).

    python bench_results/f2-recompile/table.py DIR"""

import json
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path


def recompiles_after_step_1(log: str) -> list[tuple[str, int, float]]:
    """(the line the recompiles came before, how many, seconds from the first to the last) after step 1."""
    found, times, seen_step_1 = [], [], False
    for line in log.splitlines():
        if m := re.search(r"V\d{4} (\d\d:\d\d:\d\d\.\d+) .*Recompiling function", line):
            times.append(datetime.strptime(m[1], "%H:%M:%S.%f"))
        elif m := re.match(r"(step \d+|eval \| step \d+) \|", line):
            if seen_step_1 and times:
                found.append((m[1].replace("eval | ", "eval at "), len(times), (times[-1] - times[0]).total_seconds()))
            seen_step_1, times = seen_step_1 or m[1] == "step 1", []
    return found


out = Path(sys.argv[1])
print("| layout | step 1 s | median later step s | slowest later step s | recompiles after step 1 (count, span) |")
print("|---|---|---|---|---|")
for name in ("fast", "frugal"):
    log, metrics = out / f"{name}.log", out / f"metrics_{name}.jsonl"
    if not (log.exists() and metrics.exists()):
        print(f"| {name} | missing | | | |")
        continue
    steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if "step_time_s" in r]
    slowest = max(steps[1:], key=lambda r: r["step_time_s"])
    late = "; ".join(f"{where}: {n}, {span:.1f} s" for where, n, span in recompiles_after_step_1(log.read_text()))
    print(
        f"| {name} | {steps[0]['step_time_s']:.1f} | {statistics.median(r['step_time_s'] for r in steps[1:]):.2f} | "
        f"{slowest['step_time_s']:.1f} (step {slowest['step']}) | {late or 'none'} |"
    )
