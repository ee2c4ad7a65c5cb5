"""Mode 3: rank-divergent code paths -> one rank enters a collective the others never reach.

Three classic shapes (--variant):
  a  a collective under `if rank == 0:` (all-reducing the epoch loss only where it is logged)
  b  evaluation through the DDP wrapper on rank 0 only: DDP's forward broadcasts the module's
     buffers from rank 0 (Gemma's rotary inv_freq, BatchNorm stats), a collective
  c  a NaN loss on one rank that makes only that rank `break` out of the loop

SYMPTOM  A hang: one rank waits in all-reduce/broadcast, the others wait in the next barrier (or in
         a collective of a different shape: then NCCL may even return garbage instead of hanging).
         After the process-group timeout: "Watchdog caught collective operation timeout" (NCCL) or
         "Timed out waiting ...ms for recv/send operation" (gloo).
CAUSE    Collectives are matched by their order: every rank must issue the same collectives in the
         same sequence. Any `if` on rank, on local data, or on a local NaN breaks that.
FIX      Make the decision collective and act on every rank: a) every rank all-reduces, rank 0
         prints; b) evaluate through model.module (no DDP hooks, no collectives), or on every rank;
         c) all-reduce a "bad" flag (or decide on rank 0 and broadcast), then every rank skips or
         breaks together; one 4-byte all-reduce per step, or fold it into the logged-loss one. [--fix]
SPOT IT  TORCH_DISTRIBUTED_DEBUG=DETAIL reports "Detected mismatch between collectives on ranks"
         with both op types at once. Flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000,
         TORCH_NCCL_DUMP_ON_TIMEOUT=1): the ranks' last entries differ in op type or sequence number.
         py-spy dump --pid <pid> on each rank shows where each one waits.

    torchrun --standalone --nproc_per_node=2 repro/03_rank_divergent.py --variant a|b|c [--fix] [--timeout 10]
"""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--variant", choices="abc", default="a")
ap.add_argument("--fix", action="store_true")
ap.add_argument("--timeout", type=float, default=10, help="process-group timeout, seconds")
args = ap.parse_args()

os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # NCCL: raise here on timeout instead of aborting
cuda = torch.cuda.is_available()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)  # one GPU per process, by LOCAL_RANK
dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()


class Net(torch.nn.Module):  # one buffer, like Gemma's rotary inv_freq: DDP broadcasts it every forward
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)
        self.register_buffer("inv_freq", torch.ones(8), persistent=False)

    def forward(self, x):
        return self.lin(x * self.inv_freq)


torch.manual_seed(0)
model = DDP(Net().to(dev), device_ids=[dev.index] if cuda else None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(1 + rank)  # each rank its own data
batches = [(torch.randn(4, 8, device=dev), torch.randn(4, 1, device=dev)) for _ in range(3)]
if args.variant == "c" and rank == world - 1:
    batches[1][0][0, 0] = float("nan")  # one bad sample in step 2, on the last rank only

where, error, stopped_at = "", None, None
try:
    epoch_loss = torch.zeros(1, device=dev)
    for step, (x, y) in enumerate(batches, 1):
        model.train()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.variant == "c":
            bad = torch.tensor([float(not torch.isfinite(loss))], device=dev)
            if args.fix:
                dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # every rank learns that SOME rank saw a NaN
            if bad.item():
                stopped_at = step
                break  # bug: only the rank with the NaN leaves; the others go on to backward()
        where = f"the gradient all-reduce of step {step}"
        loss.backward()
        opt.step()
        opt.zero_grad()
        epoch_loss += loss.detach()
    if args.variant == "a":
        where = "all_reduce(epoch_loss) under `if rank == 0`"
        if args.fix or rank == 0:  # bug: the logging rank alone all-reduces
            dist.all_reduce(epoch_loss)
        if rank == 0:
            print(f"mean loss over ranks: {epoch_loss.item() / world / len(batches):.4f}", flush=True)
    if args.variant == "b" and rank == 0:
        where = "DDP's buffer broadcast in the eval forward on rank 0"
        model.eval()
        with torch.no_grad():
            out = (model.module if args.fix else model)(torch.ones(2, 8, device=dev))
        print(f"eval on rank 0: {out.flatten().tolist()}", flush=True)
    where = "the barrier after the epoch" + (f" (it left the loop at the NaN of step {stopped_at})" if stopped_at else "")
    dist.barrier()
except RuntimeError as e:
    error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    print(f"[rank {rank}] stuck in {where}, then: {error}", flush=True)

if error is None:
    stop = f" (all ranks stopped at step {stopped_at})" if stopped_at else ""
    print(f"[rank {rank}] reached the end of the epoch{stop}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print(f"OK (variant {args.variant}, --fix): every rank issued the same collectives in the same order")
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: a DDP object outliving its process group can abort (gloo)
others = f"rank(s) {list(range(1, world))}"
summary = {
    "a": (f"rank 0 waits in all_reduce(epoch_loss), {others} in the barrier after the epoch",
          "the all-reduce sits under `if rank == 0`, so only rank 0 issues it",
          "all-reduce on every rank, print on rank 0"),
    "b": (f"rank 0 waits in DDP's buffer broadcast during eval, {others} in the barrier after the epoch",
          "a forward through the DDP wrapper is a collective (buffer broadcast) and only rank 0 runs eval",
          "evaluate through model.module on rank 0 (or evaluate on every rank)"),
    "c": (f"rank {world - 1} (NaN loss at step 2) left the loop and waits in the barrier; "
          f"rank(s) {list(range(world - 1))} wait in the gradient all-reduce of step 2",
          f"`if not isfinite(loss): break` was decided locally, on rank {world - 1} only",
          "all_reduce(bad_flag, MAX) (or decide on rank 0 and broadcast); every rank breaks/skips together"),
}[args.variant]
time.sleep(0.5)
if rank == 0:
    print(f"SYMPTOM: {summary[0]}; all failed at the {args.timeout:g} s timeout.")
    print(f"CAUSE:   {summary[1]}.")
    print(f"FIX:     {summary[2]} (--fix).")
sys.stdout.flush()
if rank != 0:
    time.sleep(1.5)  # let rank 0 print the summary before torchrun tears the job down
os._exit(1)  # destroy_process_group() can block after a timeout
