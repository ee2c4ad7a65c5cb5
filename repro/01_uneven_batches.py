"""Mode 1: unequal batch counts per rank -> one rank waits in an all-reduce the other never joins.

SYMPTOM  The job stops making progress near the end of an epoch. Rank 0 enters DDP's gradient
         all-reduce for its extra batch; rank 1 has left the loop and enters the barrier before the
         checkpoint. gloo: both fail at the process-group timeout ("Timed out waiting ...ms for recv
         operation to complete"). NCCL: a barrier is a one-element all-reduce, so rank 1's barrier
         is matched with rank 0's gradient all-reduce (seen on 2 H200s): rank 1 walks on as if all
         were well, rank 0 then waits in its own barrier, on the GPU, for a peer that never comes.
         No Python timeout reaches it: only NCCL's watchdog thread ends it, with "Watchdog caught
         collective operation timeout: WorkNCCL(SeqNum=.., OpType=..)" and a SIGABRT, minutes later.
CAUSE    Data sharded by hand (rows[rank::world]), filtered per rank, or an IterableDataset gives
         the ranks different numbers of batches (here 3 vs 2). Every DDP backward is a collective
         that every rank must join, so the rank with the extra batch waits forever.
FIX      DistributedSampler(drop_last=True) + DataLoader(drop_last=True), and take the number of
         steps from len(loader): identical on every rank [--fix, --fix=sampler]. For data that is
         uneven by nature: `with Join([model]):` around the loop; ranks that run out shadow the
         others' all-reduces with zeros until all are done (the extra batches' gradients are
         still divided by the full world size) [--fix=join].
SPOT IT  TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective against the other ranks' before
         running it: "Detected mismatch between collectives on ranks. Rank 0 is running collective:
         ...OpType=ALLREDUCE, TensorShape=[9]... but Rank 1 is running ...BARRIER", at once (seen on
         NCCL; on torch 2.13 CPU/gloo, DDP under DETAIL segfaulted in our runs). The
         flight recorder (TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1
         TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_: one pickle per rank at NCCL's timeout) shows rank 0 one
         collective ahead of rank 1. Print len(loader) on every rank at start-up.

This script ends by itself on every backend: each rank reports its outcome over a side gloo group
(plain TCP, which a stuck NCCL kernel cannot block); a rank still blocked at 2x --timeout is
reported by a watchdog thread, and rank 0 prints every rank's outcome.

    torchrun --standalone --nproc_per_node=2 repro/01_uneven_batches.py [--fix[=sampler|join]] [--timeout 10]
"""

import argparse
import datetime
import faulthandler
import os
import sys
import threading

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


def seconds(text):  # argparse type of --timeout: a bad value is refused before any process group starts
    t = float(text)
    if not 1 <= t <= 86400:  # also refuses nan and inf; under 1 s, start-up itself times out
        raise argparse.ArgumentTypeError(f"must be 1 to 86400 seconds, got {text}")
    return t


ap = argparse.ArgumentParser()
ap.add_argument("--fix", nargs="?", const="sampler", choices=["sampler", "join"])
ap.add_argument("--timeout", type=seconds, default=10, help="process-group timeout, seconds")
args = ap.parse_args()

os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # NCCL: wait() raises on timeout (where a wait() is reached)
cuda = torch.cuda.is_available()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)  # one GPU per process, by LOCAL_RANK
dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()
side = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=3 * args.timeout))  # for the outcome report
faulthandler.dump_traceback_later(3 * args.timeout + 10, exit=True)  # last resort: every thread's stack, exit 1

g = torch.Generator().manual_seed(0)
rows = 4 * world + 1  # one row too many on purpose: 9 on 2 ranks
data = TensorDataset(torch.randn(rows, 8, generator=g), torch.randn(rows, 1, generator=g))
if args.fix == "sampler":
    loader = DataLoader(
        data, batch_size=2, drop_last=True, sampler=DistributedSampler(data, drop_last=True, shuffle=True, seed=0)
    )
else:  # sharded by hand: rank 0 gets 5 rows (3 batches), every other rank 4 rows (2 batches)
    loader = DataLoader(Subset(data, range(rank, len(data), world)), batch_size=2)
counts = [None] * world
dist.all_gather_object(counts, len(loader))
if rank == 0:
    print(f"batches per rank: {counts}")

reported = threading.Lock()


def report(kind: str, outcome: str) -> None:
    """Once per rank (main thread or watchdog): gather every rank's outcome, rank 0 explains, all exit."""
    reported.acquire()  # the other thread, if it comes too, waits here until the process exits
    print(f"[rank {rank}] {outcome}", flush=True)
    kinds = [None] * world
    dist.all_gather_object(kinds, kind, group=side)
    done = kinds == ["ok"] * world  # every rank finished
    if rank == 0 and done:
        print(
            f"OK (--fix={args.fix}): every rank reached the barrier; no collective was left waiting"
            if args.fix
            else f"NOT REPRODUCED (no --fix): every rank finished; batches per rank {counts}"
        )
    elif rank == 0:
        long = [r for r, c in enumerate(counts) if c == max(counts)]
        short = [r for r, c in enumerate(counts) if c < max(counts)]
        seen = {k: [r for r, x in enumerate(kinds) if x == k] for k in ("timeout", "error", "blocked", "ok")}
        print(
            f"SYMPTOM: rank(s) {long} entered the all-reduce of batch {max(counts)}, rank(s) {short} the barrier "
            f"after their last batch. Then: "
            + "; ".join(
                filter(
                    None,
                    [
                        seen["timeout"] and f"rank(s) {seen['timeout']} raised at the {args.timeout:g} s timeout",
                        seen["error"] and f"rank(s) {seen['error']} raised at once (their lines above say why)",
                        seen["blocked"]
                        and f"rank(s) {seen['blocked']} still blocked with no error at {2 * args.timeout:g} s "
                        f"(waiting on the GPU: only NCCL's watchdog would end it, with a SIGABRT)",
                        seen["ok"]
                        and f"rank(s) {seen['ok']} finished: a barrier was matched with a gradient all-reduce "
                        f"(NCCL pairs collectives by order, not by kind or size), so the mismatch passed "
                        f"silently",
                    ],
                )
            )
            + "."
        )
        print(
            f"CAUSE:   batches per rank {counts}: hand-sharded data without drop_last; every DDP backward is a "
            f"collective all ranks must join."
        )
        print(
            "FIX:     DistributedSampler(drop_last=True) + DataLoader(drop_last=True), steps = len(loader) "
            "(--fix=sampler); or Join([model]) for data uneven by nature (--fix=join)."
        )
        print(
            "SPOT IT: the job stalls near the end of an epoch; log len(loader) on every rank; "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatched collectives at once; the flight recorder "
            "(TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1) shows which rank is a collective ahead."
        )
    sys.stdout.flush()
    dist.barrier(group=side)  # rank 0 has printed: now every rank may leave
    if done:
        dist.destroy_process_group()
    os._exit(0 if done and args.fix else 1)  # no interpreter teardown: it can block on a broken group


torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1).to(device), device_ids=[device.index] if cuda else None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
where = ""
watchdog = threading.Timer(
    2 * args.timeout,
    lambda: report(
        "blocked",
        f"stuck in {where}: no error after {2 * args.timeout:g} s (the main thread waits in C++ or on the GPU)",
    ),
)
watchdog.daemon = True
watchdog.start()
try:
    with Join([model], enable=args.fix == "join"):
        for i, (x, y) in enumerate(loader, 1):
            where = f"the gradient all-reduce of batch {i}/{len(loader)}"
            torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
            opt.step()
            opt.zero_grad()
    where = f"the barrier after its {len(loader)} batches"
    dist.barrier()  # e.g. "wait for rank 0 to save the checkpoint"
    checksum = model.module.weight.detach().double().sum().item()  # on GPU: waits for every queued kernel
except RuntimeError as e:
    kind = "timeout" if "timed out" in str(e).lower() else "error"  # DETAIL's mismatch check raises at once
    report(kind, f"stuck in {where}, then: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
report("ok", f"finished {len(loader)} batches; weight checksum {checksum:.10f}")
