"""Issue 25, session 7: time_budget.py's prediction (call 5, recomputed with the current launch_to_adapter) against
the real job's own wall time, 1 H200, 12B eager fast layout, realistic mix (480 rows, 60 steps), unpacked.

    python bench_results/issue25/compare_1gpu.py

The job ran twice: after time_budget on the same machine (call 5: compile caches warm) and alone on a fresh
machine (call 6: cold, as on a newly rented node). The reference is each job's "N s since launch" line.
"""

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
import time_budget as TB  # noqa: E402

report = json.loads((HERE / "call5" / "predicted.json").read_text())
measured, prediction = report["measured"], report["predictions"][0]
measured = {
    **measured,
    **{k: {int(n): s for n, s in measured[k].items()} for k in ("micro_batch_s", "first_step_s", "forward_s")},
}
run = SimpleNamespace(MICRO_BATCH=2, ACCUM_STEPS=4, PAD_TO_MULTIPLE=64, EVAL_EVERY=0)  # the planner's, call 5's log
whole = TB.launch_to_adapter(measured, prediction, report["tokens"], [], run)
whole["run_s"] += prediction["whole_run"]["evaluation_s"]  # call 5's own evaluation figure (eval rows not stored)
old = prediction["whole_run"]["run_s"]


def job(call: str, log: str, metrics: str) -> tuple[float, float]:
    since = float(re.findall(r"([\d.]+) s since launch", (HERE / call / log).read_text())[-1])
    rows = [json.loads(line) for line in (HERE / call / metrics).read_text().splitlines() if '"skipped"' in line]
    steady = [r["step_time_s"] for r in rows[1:]]
    return since, sum(steady) / len(steady)


print("| job | measured step s (2..60) | predicted step s | error | launch to adapter s | predicted s | error |")
print("|---|---|---|---|---|---|---|")
for name, call, log, metrics in (
    ("cold caches (call 6)", "call6", "run_1gpu_cold.log", "metrics_1gpu_cold.jsonl"),
    ("after time_budget (call 5)", "call5", "run_1gpu.log", "metrics_1gpu.jsonl"),
):
    since, step = job(call, log, metrics)
    print(
        f"| {name} | {step:.3f} | {prediction['step_s']:.3f} | {prediction['step_s'] / step - 1:+.1%} | {since:.1f} "
        f"| {whole['run_s']:.1f} | {whole['run_s'] / since - 1:+.1%} |"
    )
print(f"(the model before this session counted each new width's compile: {old:.1f} s predicted)")
