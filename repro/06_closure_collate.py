"""Mode 6: a closure (or lambda) collate_fn with DataLoader workers under spawn/forkserver.

SYMPTOM  The first `for batch in loader` raises on every rank, before any step:
           AttributeError: Can't pickle local object 'make_collate.<locals>.collate'
         (newer Pythons word it "Can't get local object ..."; a lambda gives the same with
         '<lambda>'), after torch's warning "Got pickle error when attempting to start a worker".
         It works with Linux's default fork and fails on macOS/Windows, with
         multiprocessing_context="spawn"/"forkserver", on Python >= 3.14 (forkserver is the
         POSIX default there), or wherever spawn is forced.
CAUSE    Workers started by spawn/forkserver receive the collate_fn by pickling, and pickle stores
         functions by their importable name; a function defined inside another function has none.
FIX      A top-level callable class holding its settings: collate.PadCollate(pad_token_id). [--fix]
SPOT IT  The traceback names the local object and ends in multiprocessing/reduction.py dump();
         nothing distributed is involved, so NCCL/DDP debug variables show nothing.

    torchrun --standalone --nproc_per_node=2 repro/06_closure_collate.py [--fix]
    (also runs as plain `python repro/06_closure_collate.py [--fix]`, as a single rank)
"""

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from collate import IGNORE_INDEX, PadCollate  # noqa: E402


def workers(text):  # argparse type of --workers: with 0, nothing is pickled and the bug cannot show
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (0 loads in the main process: no pickling), got {text}")
    return int(text)


def make_collate(pad_id):  # the bug: a closure capturing pad_id
    def collate(examples):
        width = max(len(e["input_ids"]) for e in examples)
        ids = torch.tensor([e["input_ids"] + [pad_id] * (width - len(e["input_ids"])) for e in examples])
        labels = torch.tensor([e["labels"] + [IGNORE_INDEX] * (width - len(e["labels"])) for e in examples])
        return {"input_ids": ids, "labels": labels}

    return collate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", action="store_true")
    ap.add_argument("--workers", type=workers, default=2, help="DataLoader workers (>= 1)")
    args = ap.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    # token ids stand in for tokenized chat rows; each rank its own shard
    examples = [{"input_ids": list(range(3, 3 + n)), "labels": list(range(3, 3 + n))} for n in range(4, 4 + 8 * world)][
        rank::world
    ]  # 8 a rank: 2 batches
    collate_fn = PadCollate(pad_token_id=0) if args.fix else make_collate(0)
    loader = DataLoader(
        examples, batch_size=4, collate_fn=collate_fn, num_workers=args.workers, multiprocessing_context="spawn"
    )
    try:
        shapes = [tuple(b["input_ids"].shape) for b in loader]
    except Exception as e:  # raised in this process, while starting the workers
        print(f"[rank {rank}] first batch failed: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        time.sleep(0.5)
        if rank == 0:
            print(f'SYMPTOM: ranks {list(range(world))} fail at the first batch: "{e}".')
            print(
                f"CAUSE:   spawn/forkserver workers receive collate_fn by pickling; "
                f"the closure {collate_fn.__qualname__!r} has no importable name."
            )
            print("FIX:     a top-level class: DataLoader(..., collate_fn=collate.PadCollate(pad_token_id)) (--fix).")
            print(
                "SPOT IT: every rank fails before step 1, after torch's warning 'Got pickle error when attempting to "
                "start a worker'; the same code runs with num_workers=0 or fork (Linux, Python < 3.14)."
            )
        sys.stdout.flush()
        if rank != 0:
            time.sleep(1.5)  # let rank 0 print the summary before torchrun tears the job down
        sys.exit(1)
    print(f"[rank {rank}] {len(shapes)} batches from {args.workers} spawned workers, shapes {shapes}", flush=True)
    if rank == 0:
        time.sleep(0.2)
        print(
            "OK (--fix): PadCollate is a top-level class, pickled by reference into every worker"
            if args.fix
            else "NOT REPRODUCED (no --fix): the closure reached the workers"
        )
    sys.exit(0 if args.fix else 1)


if __name__ == "__main__":  # required under spawn: workers re-import this file
    main()
