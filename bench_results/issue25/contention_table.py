"""Issue 25: x2_contention.sh's table: per run, steps 2..N of metrics.jsonl (step 1 carries the first kernel
plans), and the ratio to `alone` where the run saw the same tokens at the same step: in total, and the median of
the per-step ratios (alone runs first, on cold kernel caches: a step with a new length costs it more once).

    python bench_results/issue25/contention_table.py DIR
"""

import json
import statistics
import sys
from pathlib import Path


def steps(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if '"step_time_s"' in line][1:]


def main() -> None:
    folder = Path(sys.argv[1])
    alone = steps(folder / "alone.jsonl")
    print("| run | steps | mean step s | median step s | tokens per step | over alone, same steps | median per step |")
    print("|---|---|---|---|---|---|---|")
    for name in ("alone", "side0", "side1", "cores0", "cores1", "ddp"):
        run = steps(folder / f"{name}.jsonl")
        if not run:
            print(f"| {name} | no finished job | | | | | |")
            continue
        times = [s["step_time_s"] for s in run]
        same = [
            (s["step_time_s"], a["step_time_s"]) for s, a in zip(run, alone, strict=False) if s["tokens"] == a["tokens"]
        ]
        ratio = f"{sum(t for t, _ in same) / sum(a for _, a in same) - 1:+.1%} ({len(same)})" if same else "-"
        median = f"{statistics.median(t / a for t, a in same) - 1:+.1%}" if same else "-"
        tokens = statistics.mean(s["tokens"] for s in run)
        print(
            f"| {name} | {len(run)} | {statistics.mean(times):.3f} | {statistics.median(times):.3f} | {tokens:,.0f} "
            f"| {ratio} | {median} |"
        )


if __name__ == "__main__":
    main()
