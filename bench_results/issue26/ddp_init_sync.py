"""Issue 26: what DDP's constructor spends broadcasting the frozen weights, and what would replace it.

    torchrun --standalone --nproc_per_node=N bench_results/issue26/ddp_init_sync.py [CONFIG] [REPEATS]

Builds CONFIG's architecture (default configs/gemma-4-12b.json) with random weights, the same seed on every rank,
through train_ddp.load_model and add_lora, then times after a barrier, REPEATS times each (default 3):
- `wrap`: train_ddp.wrap_ddp, as the job builds DDP (init_sync on: rank 0's parameters, frozen ones included,
  broadcast to every rank);
- `wrap, init_sync=False`: the same DDP without that broadcast (the shapes are still compared across ranks);
- `frozen checksum`: what skipping the broadcast would need instead, a position-weighted integer sum of every frozen
  tensor's bits on its device, all-gathered and compared (all ranks must hold bit-identical base weights).
The difference of the first two is the broadcast. Prints one table on rank 0, last.
"""

import gc
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))
import train_ddp  # noqa: E402
from lm_loss import CausalLMLoss  # noqa: E402

CHUNK = 1 << 24  # elements per integer pass: 128 MiB of int64 at a time


def frozen_checksum(model) -> int:
    """Sum over frozen tensors (name order) of their bits as integers, each weighted by its position and the
    tensor's place: wraps modulo 2**64, so the result does not depend on the order of the GPU's additions."""
    total = None
    frozen = sorted((n, p) for n, p in model.named_parameters() if not p.requires_grad)
    for place, (_, p) in enumerate(frozen, start=1):
        bits = p.detach().reshape(-1).view({2: torch.int16, 4: torch.int32}[p.element_size()])
        for at in range(0, bits.numel(), CHUNK):
            part = bits[at : at + CHUNK].to(torch.int64)
            weights = torch.arange(at + 1, at + 1 + part.numel(), device=part.device, dtype=torch.int64)
            term = (part * weights).sum() * (2 * place + 1)
            total = term if total is None else total + term
    return int(total)


def timed(fn, device) -> float:
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    del result
    gc.collect()
    return elapsed


def main() -> None:
    config = sys.argv[1] if len(sys.argv) > 1 else str(HERE / "configs" / "gemma-4-12b.json")
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rank, local_rank, world = train_ddp.rank_info()
    device = train_ddp.rank_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cfg = train_ddp.Config(MODEL_CONFIG=config, ATTENTION_KERNEL="sdpa")
    torch.manual_seed(cfg.SEED)
    t0 = time.perf_counter()
    model = train_ddp.add_lora(train_ddp.load_model(cfg, device), cfg)
    build_s = time.perf_counter() - t0
    train_ddp.init_distributed(device, "/tmp", 600)
    loss = CausalLMLoss(model, cfg.CE_CHUNK_TOKENS)
    frozen_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)

    def unsynced():
        return torch.nn.parallel.DistributedDataParallel(
            loss,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
            broadcast_buffers=False,
            init_sync=False,
        )

    def checked():
        sums = [None] * world
        dist.all_gather_object(sums, frozen_checksum(model))
        assert len(set(sums)) == 1, sums

    rows = {
        "wrap (init_sync on)": [timed(lambda: train_ddp.wrap_ddp(loss, device), device) for _ in range(repeats)],
        "wrap, init_sync=False": [timed(unsynced, device) for _ in range(repeats)],
        "frozen checksum + all-gather": [timed(checked, device) for _ in range(repeats)],
    }
    if rank == 0:
        gib = frozen_bytes / 2**30
        print(f"{config}: world {world} on {device}, frozen weights {gib:.2f} GiB, built in {build_s:.1f} s")
        print(f"{'':32} {'median s':>9} {'min s':>7} {'max s':>7}")
        for name, times in rows.items():
            print(f"{name:32} {statistics.median(times):9.3f} {min(times):7.3f} {max(times):7.3f}")
        broadcast = statistics.median(rows["wrap (init_sync on)"]) - statistics.median(rows["wrap, init_sync=False"])
        print(f"{'broadcast (difference)':32} {broadcast:9.3f}   = {gib / max(broadcast, 1e-9):.1f} GiB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
