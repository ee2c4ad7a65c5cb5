"""Issue 25: time_budget.py's predictions against the real jobs' own wall times, per steady step and per whole run.

    python bench_results/issue25/compare.py DIR

DIR holds x2_call.sh's files for each mode run (unpacked, packed): predicted_MODE.json (time_budget.py --json,
predictions for 1 and 2 GPUs), run_MODE_NGPUgpu.log (the job; its last line gives "N s since launch") and
metrics_MODE_NGPUgpu.jsonl (its steps). A step is compared from step 2 on (step 1 carries the first compiles,
which the whole run counts). Prints one table and the worst error.
"""

import json
import re
import sys
from pathlib import Path


def measured(folder: Path, mode: str, gpus: int) -> tuple[float, float, int] | None:
    log, metrics = folder / f"run_{mode}_{gpus}gpu.log", folder / f"metrics_{mode}_{gpus}gpu.jsonl"
    if not (log.exists() and metrics.exists()):
        return None
    since = re.findall(r"([\d.]+) s since launch", log.read_text())
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if '"step_time_s"' in line]
    if not since or len(steps) < 2:
        return None
    steady = [s["step_time_s"] for s in steps[1:]]
    return sum(steady) / len(steady), float(since[-1]), len(steps)


def main() -> None:
    folder = Path(sys.argv[1])
    print("| mode | GPUs | steps | step s | predicted | error | launch to adapter s | predicted | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors = []
    for mode in ("unpacked", "packed"):
        report = folder / f"predicted_{mode}.json"
        if not report.exists():
            continue
        for prediction in json.loads(report.read_text())["predictions"]:
            gpus = prediction["gpus_per_node"] * prediction["nodes"]
            job = measured(folder, mode, gpus)
            if job is None:
                print(f"| {mode} | {gpus} | no finished job | | | | | | |")
                continue
            step, since, n = job
            step_err, run_err = prediction["step_s"] / step - 1, prediction["whole_run"]["run_s"] / since - 1
            errors += [(abs(step_err), f"{mode}, {gpus} GPU(s), per step"), (abs(run_err), f"{mode}, {gpus}, run")]
            print(
                f"| {mode} | {gpus} | {n} | {step:.3f} | {prediction['step_s']:.3f} | {step_err:+.1%} | {since:.1f} "
                f"| {prediction['whole_run']['run_s']:.1f} | {run_err:+.1%} |"
            )
    if errors:
        worst = max(errors)
        print(f"worst error: {worst[0]:.1%} ({worst[1]})")


if __name__ == "__main__":
    main()
