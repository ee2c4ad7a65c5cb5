"""What is allocated at train_ddp.py's peak: the real job (1 GPU, no torchrun) on the 12B architecture under
torch.cuda.memory's allocation history, then every block live at the highest point, grouped by where it was
allocated.

    python3 bench_results/issue24/memory_peak.py [--trap GIB] [NAME=VALUE ...]  (MEMORY_TARGET_GIB=25 COMPILE_LAYERS=1)

--trap GIB: no allocation history (its Python stacks broke the compiled, checkpointed recompute on the H200:
"SystemError: ... apply returned NULL"); instead the caching allocator is capped at GIB (expandable segments, so
reserved stays close to allocated) and the first allocation past it prints its Python stack and the live blocks
by size, then the job fails with the out-of-memory error.

Runs MAX_STEPS=3 of 2,048-token synthetic rows (bench.py's), 8 samples per step. Prints the peak, the step
phase around it, and the live GiB by allocation site (the innermost frames in this repository, transformers,
peft or torch.nn / autograd), largest first.
"""

import collections
import gc
import os
import sys
import tempfile
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import bench  # noqa: E402
import train_ddp  # noqa: E402


def job_environment(**overrides: str) -> None:
    """train_ddp.py's constants for one 1-GPU job on the 12B architecture: bench.py's 2,048-token synthetic
    rows, 8 samples per step, MAX_STEPS=3, in a temporary OUTPUT_DIR; `overrides` last."""
    work = Path(tempfile.mkdtemp(prefix="issue24-job-"))
    bench.synthetic_conversations(work / "rows.jsonl", n=96, min_words=4096)
    os.environ.update(
        MODEL_CONFIG=str(REPO / "configs" / "gemma-4-12b.json"),
        MODEL_ID=str(REPO / "assets" / "tiny-gemma4"),
        DATA_PATH=str(work / "rows.jsonl"),
        OUTPUT_DIR=str(work / "out"),
        MAX_LEN="2048",
        ASSISTANT_ONLY_LOSS="0",
        MAX_STEPS="3",
        EPOCHS="1000",
        MICRO_BATCH="1",
        ACCUM_STEPS="8",
        DRIFT_CHECK_EVERY="0",
        RESUME="",
        **overrides,
    )


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--trap"]:
        trap(float(args[1]), dict(arg.split("=", 1) for arg in args[2:]))
        return
    job_environment(**dict(arg.split("=", 1) for arg in args))
    torch.cuda.memory._record_memory_history(
        max_entries=2_000_000, context=os.environ.get("HISTORY_CONTEXT", "all"), stacks="python"
    )
    train_ddp.main()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)

    events = [e for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    total, peak, peak_at = 0, 0, 0
    for i, e in enumerate(events):
        total += e["size"] if e["action"] == "alloc" else -e["size"]
        if total > peak:
            peak, peak_at = total, i
    live = {}
    for e in events[: peak_at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        else:
            live.pop(e["addr"], None)
    by_site, example = collections.Counter(), {}
    for e in live.values():
        by_site[site(e.get("frames", []))] += e["size"]
        example[site(e.get("frames", []))] = e
    print(f"\nsettings: {' '.join(sys.argv[1:])}")
    print(f"peak allocated {peak / 2**30:.3f} GiB at event {peak_at} of {len(events)}; {len(live)} live blocks")
    print("| GiB | allocated at |\n|---|---|")
    for where, size in by_site.most_common(25):
        print(f"| {size / 2**30:.3f} | {where} |")
    print("\nthe allocation at the peak, then one block of each of the 8 largest sites, innermost frame first:")
    for e in [events[peak_at]] + [example[where] for where, _ in by_site.most_common(25)[8:16]]:
        print(
            f"{e['size'] / 2**20:.2f} MiB: "
            + " < ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in e.get("frames", [])[:40])
        )


def trap(gib: float, overrides: dict) -> None:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    job_environment(**overrides)
    torch.cuda.set_per_process_memory_fraction(gib * 2**30 / torch.cuda.get_device_properties(0).total_memory)

    def observer(device, alloc, device_allocated, device_free):
        print(
            f"\ntrap at {gib} GiB: allocating {alloc / 2**20:.1f} MiB with {torch.cuda.memory_allocated() / 2**30:.3f} "
            f"GiB allocated, {torch.cuda.memory_reserved() / 2**30:.3f} reserved",
            flush=True,
        )
        traceback.print_stack(file=sys.stdout)
        sizes = collections.Counter()
        for segment in torch.cuda.memory_snapshot():
            for block in segment["blocks"]:
                if block["state"] == "active_allocated":
                    sizes[block["size"]] += 1
        print("| MiB each | count | GiB |\n|---|---|---|")
        for size, count in sorted(sizes.items(), key=lambda kv: -kv[0] * kv[1])[:30]:
            print(f"| {size / 2**20:.2f} | {count} | {size * count / 2**30:.3f} |")
        print("| Python-held CUDA tensor (not a parameter) | MiB | held by |\n|---|---|---|")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and obj.is_cuda and not isinstance(obj, torch.nn.Parameter):
                mib = obj.untyped_storage().nbytes() / 2**20
                if mib >= 1:
                    holders = ", ".join(sorted({type(r).__name__ for r in gc.get_referrers(obj)}))
                    print(f"| {tuple(obj.shape)} {obj.dtype} | {mib:.2f} | {holders} |")
        sys.stdout.flush()

    torch._C._cuda_attach_out_of_memory_observer(observer)
    train_ddp.main()


def site(frames: list) -> str:
    """The innermost frames worth naming: this repository's, then transformers/peft/torch.nn/autograd."""
    named = []
    for f in frames:
        name = f["filename"]
        if str(REPO) in name or any(k in name for k in ("transformers/", "peft/", "torch/nn/", "torch/autograd/")):
            named.append(f"{Path(name).name}:{f['line']} {f['name']}")
        if len(named) == 3:
            break
    return " <- ".join(named) or "(no Python frame)"


if __name__ == "__main__":
    main()
