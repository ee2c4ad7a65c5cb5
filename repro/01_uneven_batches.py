"""Mode 1: unequal batch counts per rank -> one rank waits in an all-reduce the other never joins.

SYMPTOM  The job stops making progress near the end of an epoch. Rank 0 sits in DDP's gradient
         all-reduce for its extra batch; rank 1 has left the loop and waits in the barrier before
         the checkpoint. Nothing is printed until the process-group timeout (default 10 min for
         NCCL): then the NCCL watchdog logs "Watchdog caught collective operation timeout:
         WorkNCCL(SeqNum=.., OpType=ALLREDUCE, ..) ran for ... milliseconds before timing out",
         gloo "Timed out waiting ...ms for recv operation to complete".
CAUSE    Data sharded by hand (rows[rank::world]), filtered per rank, or an IterableDataset gives
         the ranks different numbers of batches (here 3 vs 2). Every DDP backward is a collective
         that every rank must join, so the rank with the extra batch waits forever.
FIX      DistributedSampler(drop_last=True) + DataLoader(drop_last=True), and take the number of
         steps from len(loader): identical on every rank [--fix, --fix=sampler]. For data that is
         uneven by nature: `with Join([model]):` around the loop; ranks that run out shadow the
         others' all-reduces with zeros until all are done (the extra batches' gradients are
         still divided by the full world size) [--fix=join].
SPOT IT  TORCH_DISTRIBUTED_DEBUG=DETAIL turns the hang into an immediate "Detected mismatch between
         collectives on ranks. Rank 0 is running collective: ...OpType=ALLREDUCE... but Rank 1 is
         running ...BARRIER". The NCCL flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000
         TORCH_NCCL_DUMP_ON_TIMEOUT=1) shows rank 0 one collective ahead of rank 1. Print
         len(loader) on every rank at start-up.

    torchrun --standalone --nproc_per_node=2 repro/01_uneven_batches.py [--fix[=sampler|join]] [--timeout 10]
"""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--fix", nargs="?", const="sampler", choices=["sampler", "join"])
ap.add_argument("--timeout", type=float, default=10, help="process-group timeout, seconds")
args = ap.parse_args()

os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # NCCL: raise here on timeout instead of aborting
cuda = torch.cuda.is_available()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)  # one GPU per process, by LOCAL_RANK
dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(9, 8, generator=g), torch.randn(9, 1, generator=g))  # 9 rows: odd on purpose
if args.fix == "sampler":
    loader = DataLoader(data, batch_size=2, drop_last=True,
                        sampler=DistributedSampler(data, drop_last=True, shuffle=True, seed=0))
else:  # sharded by hand: rank 0 gets 5 rows (3 batches), rank 1 gets 4 rows (2 batches)
    loader = DataLoader(Subset(data, range(rank, len(data), world)), batch_size=2)
counts = [None] * world
dist.all_gather_object(counts, len(loader))
if rank == 0:
    print(f"batches per rank: {counts}")

torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1).to(device), device_ids=[device.index] if cuda else None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
where, error = "", None
try:
    with Join([model], enable=args.fix == "join"):
        for i, (x, y) in enumerate(loader, 1):
            where = f"the gradient all-reduce of batch {i}/{len(loader)}"
            torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
            opt.step()
            opt.zero_grad()
    where = f"the barrier after its {len(loader)} batches"
    dist.barrier()  # e.g. "wait for rank 0 to save the checkpoint"
except RuntimeError as e:
    error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    print(f"[rank {rank}] stuck in {where}, then: {error}", flush=True)

if error is None:
    w = model.module.weight.detach().double().sum().item()
    print(f"[rank {rank}] finished {len(loader)} batches; weight checksum {w:.10f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print(f"OK (--fix={args.fix}): every rank reached the barrier; no collective was left waiting")
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: a DDP object outliving its process group can abort (gloo)
time.sleep(0.5)  # let every rank report first
if rank == 0:
    long = [r for r, c in enumerate(counts) if c == max(counts)]
    short = [r for r, c in enumerate(counts) if c < max(counts)]
    print(f"SYMPTOM: rank(s) {long} blocked in the all-reduce of batch {max(counts)} while rank(s) {short} "
          f"waited in the next barrier; all failed only at the {args.timeout:g} s timeout.")
    print(f"CAUSE:   batches per rank {counts}: hand-sharded data without drop_last; every DDP backward is a "
          f"collective all ranks must join.")
    print("FIX:     DistributedSampler(drop_last=True) + DataLoader(drop_last=True), steps = len(loader) "
          "(--fix=sampler); or Join([model]) for data uneven by nature (--fix=join).")
sys.stdout.flush()
if rank != 0:
    time.sleep(1.5)  # let rank 0 print the summary before torchrun tears the job down
os._exit(1)  # destroy_process_group() can block after a timeout
