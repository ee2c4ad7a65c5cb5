"""Mode 5: gradient-accumulation sync mistakes with model.no_sync().

Right: micro-batches 1..A-1 run forward AND backward inside `with model.no_sync():`, the last one
runs outside, so DDP all-reduces once per optimizer step (once per gradient bucket), overlapped
with the last backward. DDP decides whether to sync in the FORWARD: no_sync must cover it.
  a  forward outside no_sync, only backward inside -> DDP all-reduces after every micro-batch.
     Gradients stay correct (averaging is linear), but communication is A times larger: slow.
  b  the last micro-batch inside no_sync too -> no all-reduce at all: each rank steps on its own
     gradient and the replicas drift apart, silently.

SYMPTOM  a: scaling efficiency drops as accumulation grows; a profiler trace shows an all-reduce
         after each micro-batch backward. b: nothing, until evaluation or a checkpoint from another
         rank disagrees; parameter checksums differ across ranks.
CAUSE    a: the forward ran with require_backward_grad_sync=True. b: the step that should sync
         never left no_sync.
FIX      `ctx = model.no_sync() if i < A - 1 else nullcontext()`, with forward and backward inside
         ctx.   [--fix]
SPOT IT  Count all-reduces with a DDP comm hook (below) or torch.profiler (allreduce / ncclKernel
         events per step); compare a checksum of the trained parameters across ranks
         (all_gather). NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL logs every collective call (verbose);
         the flight recorder (TORCH_FR_BUFFER_SIZE) keeps the last N with sequence numbers.

    torchrun --standalone --nproc_per_node=2 repro/05_accumulation_sync.py --variant a|b [--fix]
"""

import argparse
import datetime
import hashlib
import os
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def at_least(low):  # argparse type: an int >= low; a bad value is refused before any process group starts
    def integer(text):
        if int(text) < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return int(text)

    return integer


def seconds(text):  # argparse type of --timeout
    t = float(text)
    if not 1 <= t <= 86400:  # also refuses nan and inf; under 1 s, start-up itself times out
        raise argparse.ArgumentTypeError(f"must be 1 to 86400 seconds, got {text}")
    return t


ap = argparse.ArgumentParser()
ap.add_argument("--variant", choices="ab", default="a")
ap.add_argument("--fix", action="store_true")
ap.add_argument("--accum", type=at_least(2), default=4, help="micro-batches per optimizer step (>= 2)")
ap.add_argument("--steps", type=at_least(1), default=3)
ap.add_argument("--timeout", type=seconds, default=20, help="process-group timeout, seconds")
args = ap.parse_args()

cuda = torch.cuda.is_available()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)  # one GPU per process, by LOCAL_RANK
dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4).to(dev), device_ids=[dev.index] if cuda else None, gradient_as_bucket_view=True)
allreduces = [0]


def counting_hook(state, bucket):  # DDP calls this once per gradient bucket it all-reduces
    allreduces[0] += 1
    return default_hooks.allreduce_hook(state, bucket)


model.register_comm_hook(None, counting_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(1 + rank)  # rank-dependent data, as under a DistributedSampler
per_step = []
for _ in range(args.steps):
    before = allreduces[0]
    for i in range(args.accum):
        x, y = torch.randn(8, 16, device=dev), torch.randn(8, 4, device=dev)
        last = i == args.accum - 1
        if args.fix:
            with model.no_sync() if not last else nullcontext():
                torch.nn.functional.mse_loss(model(x), y).div(args.accum).backward()
        elif args.variant == "a":
            loss = torch.nn.functional.mse_loss(model(x), y).div(args.accum)  # forward OUTSIDE no_sync
            with model.no_sync() if not last else nullcontext():
                loss.backward()
        else:
            with model.no_sync():  # every micro-batch, the last one included
                torch.nn.functional.mse_loss(model(x), y).div(args.accum).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    per_step.append(allreduces[0] - before)

flat = torch.cat([p.detach().cpu().flatten() for p in model.parameters()])
mine = (per_step, hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16])
gathered = [None] * world
dist.all_gather_object(gathered, mine)
drift = len({g[1] for g in gathered}) > 1
too_many = any(n > 1 for g in gathered for n in g[0])
bad = drift or too_many
if rank == 0:
    label = "--fix" if args.fix else f"variant {args.variant}"
    print(f"{label}: {args.steps} optimizer steps x {args.accum} micro-batches, 1 gradient bucket")
    for r, (counts, sha) in enumerate(gathered):
        print(f"  rank {r}: all-reduces per optimizer step {counts} (right: 1 each)   parameter sha256 {sha}")
    total = sum(gathered[0][0])
    if not bad:
        print(
            f"{'OK' if args.fix else 'NOT REPRODUCED'} ({label}): {total} all-reduces for {args.steps} steps, "
            "identical parameters on every rank"
        )
    elif too_many:
        print(
            f"SYMPTOM: {total} all-reduces for {args.steps} optimizer steps on every rank instead of {args.steps}: "
            f"{args.accum}x the communication (gradients still agree)."
        )
        print(
            "CAUSE:   the forward ran outside no_sync(); DDP arms the all-reduce in the forward, "
            "so a backward under no_sync still syncs."
        )
        print(
            "FIX:     run forward AND backward of micro-batches 1..A-1 inside no_sync(), the last one outside (--fix)."
        )
        print(
            "SPOT IT: no error; step time grows with the accumulation count; a torch.profiler trace (or a counting "
            "comm hook) shows an allreduce after every micro-batch's backward, not one per optimizer step."
        )
    else:
        print(
            f"SYMPTOM: {total} all-reduces in {args.steps} steps; parameters on ranks {list(range(world))} differ "
            "(sha256 above): replicas drifted."
        )
        print("CAUSE:   the last micro-batch also ran inside no_sync(), so gradients were never all-reduced.")
        print("FIX:     leave no_sync() for the last micro-batch of each step: one all-reduce per step (--fix).")
        print(
            "SPOT IT: no error and no allreduce in a profiler trace; checkpoints saved by different ranks differ, "
            "and an all_gather of a parameter checksum differs across ranks."
        )
sys.stdout.flush()
if bad and rank != 0:
    time.sleep(1.5)  # let rank 0 print the summary before torchrun tears the job down
if not bad:
    dist.destroy_process_group()
os._exit(0 if args.fix and not bad else 1)
