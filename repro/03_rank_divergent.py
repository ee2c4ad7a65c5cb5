"""Mode 3: rank-divergent code paths -> one rank enters a collective the others never reach.

Three classic shapes (--variant):
  a  a collective under `if rank == 0:` (all-reducing the epoch loss only where it is logged)
  b  evaluation through the DDP wrapper on rank 0 only: DDP's forward broadcasts the module's
     buffers from rank 0 (Gemma's rotary inv_freq, BatchNorm stats), a collective
  c  a NaN loss on one rank that makes only that rank `break` out of the loop

SYMPTOM  gloo: a hang, one rank in all-reduce/broadcast, the others in the next barrier, until the
         process-group timeout ("Timed out waiting ...ms for recv/send operation"). NCCL: worse, a
         barrier is a one-element all-reduce, so the stray collective is usually MATCHED with
         another rank's barrier or gradient all-reduce of a different size or kind (all three
         variants, on 2 H200s): (a) rank 0 even prints the "mean loss over ranks", computed from
         rank 1's barrier buffer. One rank finishes as if all were well; another hangs later, on the
         GPU, where no Python timeout reaches it; NCCL's watchdog thread ends the job minutes later
         with "Watchdog caught collective operation timeout" and a SIGABRT.
CAUSE    Collectives are matched by their order: every rank must issue the same collectives in the
         same sequence. Any `if` on rank, on local data, or on a local NaN breaks that.
FIX      Make the decision collective and act on every rank: a) every rank all-reduces, rank 0
         prints; b) evaluate through model.module (no DDP hooks, no collectives), or on every rank;
         c) all-reduce a "bad" flag (or decide on rank 0 and broadcast), then every rank skips or
         breaks together; one 4-byte all-reduce per step, or fold it into the logged-loss one. [--fix]
SPOT IT  TORCH_DISTRIBUTED_DEBUG=DETAIL checks each collective's kind and shapes against the other
         ranks' first: "Detected mismatch between collectives on ranks", at once (seen on NCCL; on
         torch 2.13 CPU/gloo, DDP under DETAIL segfaulted in our runs).
         Flight recorder (TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1
         TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_: one pickle per rank at NCCL's timeout): the entries with the
         same sequence number differ in op type or size. py-spy dump --pid <pid> shows where each waits.

This script ends by itself on every backend: each rank reports its outcome over a side gloo group
(plain TCP, which a stuck NCCL kernel cannot block); a rank still blocked at 2x --timeout is
reported by a watchdog thread, and rank 0 prints every rank's outcome.

    torchrun --standalone --nproc_per_node=2 repro/03_rank_divergent.py --variant a|b|c [--fix] [--timeout 10]
"""

import argparse
import datetime
import faulthandler
import os
import sys
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def seconds(text):  # argparse type of --timeout: a bad value is refused before any process group starts
    t = float(text)
    if not 1 <= t <= 86400:  # also refuses nan and inf; under 1 s, start-up itself times out
        raise argparse.ArgumentTypeError(f"must be 1 to 86400 seconds, got {text}")
    return t


ap = argparse.ArgumentParser()
ap.add_argument("--variant", choices="abc", default="a")
ap.add_argument("--fix", action="store_true")
ap.add_argument("--timeout", type=seconds, default=10, help="process-group timeout, seconds")
args = ap.parse_args()

os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # NCCL: wait() raises on timeout (where a wait() is reached)
cuda = torch.cuda.is_available()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)  # one GPU per process, by LOCAL_RANK
dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()
side = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=3 * args.timeout))  # for the outcome report
faulthandler.dump_traceback_later(3 * args.timeout + 10, exit=True)  # last resort: every thread's stack, exit 1
others = list(range(1, world))
DIVERGENCE, CAUSE, FIX = {
    "a": (
        f"rank 0 issued all_reduce(epoch_loss), rank(s) {others} the barrier after the epoch",
        "the all-reduce sits under `if rank == 0`, so only rank 0 issues it",
        "all-reduce on every rank, print on rank 0",
    ),
    "b": (
        f"rank 0 issued DDP's buffer broadcast in its eval forward, rank(s) {others} the barrier after the epoch",
        "a forward through the DDP wrapper is a collective (buffer broadcast) and only rank 0 runs eval",
        "evaluate through model.module on rank 0 (or evaluate on every rank)",
    ),
    "c": (
        f"rank {world - 1} (NaN loss at step 2) left the loop and issued the barrier, rank(s) {list(range(world - 1))} "
        f"the gradient all-reduce of step 2",
        f"`if not isfinite(loss): break` was decided locally, on rank {world - 1} only",
        "all_reduce(bad_flag, MAX) (or decide on rank 0 and broadcast); every rank breaks/skips together",
    ),
}[args.variant]
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
            f"OK (variant {args.variant}, --fix): every rank issued the same collectives in the same order"
            if args.fix
            else f"NOT REPRODUCED (variant {args.variant}, no --fix): every rank reached the end of the epoch"
        )
    elif rank == 0:
        seen = {k: [r for r, x in enumerate(kinds) if x == k] for k in ("timeout", "error", "blocked", "ok")}
        print(
            f"SYMPTOM: {DIVERGENCE}. Then: "
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
                        and f"rank(s) {seen['ok']} finished: their collective was matched with one of another kind or "
                        f"size (NCCL pairs collectives by order only), so the mismatch passed silently",
                    ],
                )
            )
            + "."
        )
        print(f"CAUSE:   {CAUSE}.")
        print(f"FIX:     {FIX} (--fix).")
        print(
            "SPOT IT: TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatched collectives at once; the flight recorder "
            "(TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1) shows the ranks' differing entries."
        )
    sys.stdout.flush()
    dist.barrier(group=side)  # rank 0 has printed: now every rank may leave
    if done:
        dist.destroy_process_group()
    os._exit(0 if done and args.fix else 1)  # no interpreter teardown: it can block on a broken group


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

where, stopped_at = "", None
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
    where = "the barrier after the epoch" + (
        f" (it left the loop at the NaN of step {stopped_at})" if stopped_at else ""
    )
    dist.barrier()
    torch.zeros(1, device=dev).item()  # on GPU: wait for every queued kernel before calling this rank done
except RuntimeError as e:
    kind = "timeout" if "timed out" in str(e).lower() else "error"  # DETAIL's mismatch check raises at once
    report(kind, f"stuck in {where}, then: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
report("ok", "reached the end of the epoch" + (f" (it left the loop at step {stopped_at})" if stopped_at else ""))
