"""Mode 7: every rank writes the same checkpoint file -> a file nobody meant to save.

SYMPTOM  Resuming fails with "PytorchStreamReader failed reading zip archive", "failed finding
         central directory", a CRC error or a truncated file; or, worse, it loads and holds a mix
         of several ranks' tensors (or another rank's state) and training resumes from garbage.
         On shared storage (NFS, Lustre, a bucket mount) it depends on timing: rare and unreproducible.
CAUSE    torch.save(model.state_dict(), path) on every rank: N writers open the same path with
         "wb" (truncating it) and write it concurrently, each with its own file offset; the bytes
         on disk are whichever rank wrote each block last. Ranks can hold different state:
         replicas that drifted (modes 4, 5), per-rank RNG or data-loader state, or one rank a step
         behind. A rank that reads while another writes sees a half-written file.
FIX      Only rank 0 writes: to a temporary file in the same directory, flush + os.fsync,
         os.replace() onto the final name (atomic: readers see the old file or the new one), then
         dist.barrier(); other ranks read only after the barrier.   [--fix]
SPOT IT  The file's size or checksum differs between saves of the same step; `python -m zipfile
         -t ckpt.pt` or torch.load fails; grep the code for torch.save/save_pretrained outside
         `if rank == 0`. No distributed debug variable sees it: it is not a collective.

This script makes one real interleaving deterministic: both ranks open the file like torch.save,
then write their serialised bytes block by block, taking turns with barriers so that the last
writer of each block alternates (what concurrent writers on shared storage do, at random).

    torchrun --standalone --nproc_per_node=2 repro/07_all_ranks_write.py [--fix] [--dir /shared/tmp]
"""

import argparse
import datetime
import hashlib
import io
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist


def block(text):  # argparse type of --block; a bad value is refused before any process group starts
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 byte, got {text}")
    return int(text)


def seconds(text):  # argparse type of --timeout
    t = float(text)
    if not 1 <= t <= 86400:  # also refuses nan and inf; under 1 s, start-up itself times out
        raise argparse.ArgumentTypeError(f"must be 1 to 86400 seconds, got {text}")
    return t


ap = argparse.ArgumentParser()
ap.add_argument("--fix", action="store_true")
ap.add_argument("--dir", default=None, help="directory for the checkpoint (shared storage for multi-node)")
ap.add_argument("--block", type=block, default=64 * 1024, help="bytes written per turn")
ap.add_argument("--timeout", type=seconds, default=20, help="process-group timeout, seconds")
args = ap.parse_args()

cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()
where = [tempfile.mkdtemp(prefix="repro07_", dir=args.dir) if rank == 0 else None]
dist.broadcast_object_list(where, src=0)
path = os.path.join(where[0], "adapter.pt")


def sha(sd):
    return hashlib.sha256(b"".join(t.numpy().tobytes() for t in sd.values())).hexdigest()[:16]


# each rank's state differs, e.g. drifted replicas or per-rank RNG state
state = {
    "lora_A": torch.randn(128, 256, generator=torch.Generator().manual_seed(rank)),
    "lora_B": torch.full((256, 128), float(rank)),
}
shas = [None] * world
dist.all_gather_object(shas, sha(state))

if args.fix:
    if rank == 0:
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX: the final name never points at a partial file
        dfd = os.open(where[0], os.O_RDONLY)
        os.fsync(dfd)  # make the rename itself durable
        os.close(dfd)
    dist.barrier()  # nobody reads before rank 0 is done
else:
    buf = io.BytesIO()
    torch.save(state, buf)  # what torch.save(state, path) would write, on every rank
    data = buf.getvalue()
    sizes = [None] * world
    dist.all_gather_object(sizes, len(data))
    f = open(path, "wb")  # every rank: the same path, truncated
    dist.barrier()
    for b, start in enumerate(range(0, max(sizes), args.block)):
        for turn in range(world) if b % 2 == 0 else reversed(range(world)):
            if rank == turn:
                f.write(data[start : start + args.block])  # own file offset, advancing block by block
                f.flush()
                os.fsync(f.fileno())
            dist.barrier()
    f.close()
    dist.barrier()

try:
    sd = torch.load(path, weights_only=True)
    loaded, mine = (
        sha(sd),
        sum((sd[k] == state[k]).sum().item() for k in state) / sum(t.numel() for t in state.values()),
    )
    got = {shas[r]: f"rank {r}'s state" for r in range(world)}.get(loaded, f"a state no rank held (sha256 {loaded})")
    got += f"; {mine:.0%} of its values are this rank's"
except Exception as e:
    loaded, got = None, f"an unreadable file: {type(e).__name__}: {str(e).splitlines()[0][:150]}"
print(f"[rank {rank}] loaded {path}: {got}", flush=True)
ok = loaded == shas[0]
results = [None] * world
dist.all_gather_object(results, ok)
dist.barrier()
if rank == 0:
    shutil.rmtree(where[0], ignore_errors=True)
    for r, s in enumerate(shas):
        print(f"  rank {r} meant to save sha256 {s}")
    if all(results) and args.fix:
        print("OK (--fix): rank 0 wrote to a temp file, fsync, os.replace, barrier; every rank read rank 0's state")
    elif all(results):
        print(f"NOT REPRODUCED (no --fix): ranks {list(range(world))} all wrote, every rank read rank 0's state")
    else:
        print(
            f"SYMPTOM: ranks {list(range(world))} all wrote {os.path.basename(path)}; "
            f"rank 0 reads back {got.split(';')[0]}, not its own state."
        )
        print(
            "CAUSE:   every rank called torch.save on the same path; concurrent writers truncate and interleave blocks."
        )
        print(
            "FIX:     if rank == 0: save to a temp file, fsync, os.replace; then barrier; others read after it (--fix)."
        )
        print(
            "SPOT IT: resuming fails ('failed finding central directory', CRC error) or the loss jumps after a resume; "
            "the checkpoint's sha256 changes between saves of one step; torch.save outside `if rank == 0` in the code."
        )
sys.stdout.flush()
if not (all(results) and args.fix):
    if rank != 0:
        time.sleep(1.5)  # let rank 0 print the summary before torchrun tears the job down
    os._exit(1)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # skip interpreter teardown: a DDP object outliving its process group can abort (gloo)
