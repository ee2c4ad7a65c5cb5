"""Attention for packed rows at the 12B's shapes, one H200: forward+backward time and error of each candidate.

    python bench_results/issue23/attention_kernels.py [--rows 8] [--mix realistic|short]

Rows of 2,048 tokens packed with conversations drawn from make_chat_mix.py's length distribution (token counts of the
tiny default's tokenizer). Layers: sliding (16 heads, 8 KV heads, head_dim 256, window 1,024) and global (16
heads, 2 KV heads, head_dim 512). Candidates:
  flex          attention.packed_masks' block masks, flex_attention compiled (what train_ddp.py runs)
  dense-mask    SDPA with the boolean [B, 1, L, L] mask, K/V repeated (transformers' position_ids path on SDPA)
  per-document  SDPA once per conversation, is_causal (a window mask only where a conversation is longer)
Error: max |out - FP32 dense reference| over the output and the q/k/v gradients, relative to the reference's max.
"""

import argparse
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import attention  # noqa: E402

LAYERS = {"sliding": (16, 8, 256, 1024), "global": (16, 2, 512, None)}  # heads, kv heads, head_dim, window


def conversation_lengths(rng: random.Random, short: bool) -> int:
    """Token counts close to make_chat_mix.py's (median ~460 realistic, ~150 short)."""
    if short:
        return int(min(2048, 60 + rng.lognormvariate(4.4, 0.5)))
    kind = rng.random()
    mu = 5.2 if kind < 0.5 else 6.0 if kind < 0.85 else 7.0
    return int(min(2048, rng.lognormvariate(mu, 0.5)))


def packed_position_ids(rows: int, width: int, short: bool) -> tuple[torch.Tensor, list[list[int]]]:
    rng, ids, docs = random.Random(0), torch.zeros(rows, width, dtype=torch.long), []
    for r in range(rows):
        at, row = 0, []
        while True:
            n = conversation_lengths(rng, short)
            if at + n > width:
                break
            ids[r, at : at + n], at = torch.arange(n), at + n
            row.append(n)
        ids[r, at:] = torch.arange(width - at)
        docs.append(row + [width - at] if at < width else row)
    return ids.cuda(), docs


def dense(q, k, v, mask):
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask, scale=1.0
    )


def per_document(q, k, v, docs, window):
    out = torch.empty_like(q)
    for r, row in enumerate(docs):
        at = 0
        for n in row:
            s = slice(at, at + n)
            mask = None
            if window is not None and n > window:
                i = torch.arange(n, device=q.device)
                mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
            out[r : r + 1, :, s] = F.scaled_dot_product_attention(
                q[r : r + 1, :, s],
                k[r : r + 1, :, s],
                v[r : r + 1, :, s],
                attn_mask=mask,
                is_causal=mask is None,
                scale=1.0,
                enable_gqa=True,
            )
            at += n
    return out


def timed(fn, inputs, repeats=10):
    for _ in range(3):
        out = fn(*inputs)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(*inputs)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--mix", choices=("realistic", "short"), default="realistic")
    args = ap.parse_args()
    position_ids, docs = packed_position_ids(args.rows, 2048, args.mix == "short")
    n_docs = sum(len(r) for r in docs)
    print(f"{args.rows} rows of 2,048, {n_docs} conversations (padding included), mix {args.mix}")
    table = []
    for name, (heads, kv_heads, dim, window) in LAYERS.items():
        masks = attention.packed_masks(position_ids, window or 10**9)
        dense_masks = attention.packed_masks(position_ids.cpu(), window or 10**9)
        kind = "sliding_attention" if window else "full_attention"
        block_mask, bool_mask = masks[kind], dense_masks[kind].cuda()
        g = torch.Generator(device="cuda").manual_seed(0)
        shapes = [(args.rows, heads, 2048, dim), (args.rows, kv_heads, 2048, dim), (args.rows, kv_heads, 2048, dim)]
        base = [torch.randn(s, device="cuda", generator=g) * 0.5 for s in shapes]
        reference = [t.clone().requires_grad_() for t in base]
        ref_out = dense(*reference, bool_mask)
        ref_out.backward(torch.ones_like(ref_out))
        ref = [ref_out.detach()] + [t.grad for t in reference]
        candidates = {
            "flex": lambda q, k, v, m=block_mask: attention._flex(q, k, v, m, 1.0).transpose(1, 2),
            "dense-mask": lambda q, k, v, m=bool_mask: dense(q, k, v, m),
            "per-document": lambda q, k, v, w=window: per_document(q, k, v, docs, w),
        }
        for cname, fn in candidates.items():
            inputs = [t.bfloat16().requires_grad_() for t in base]
            out = fn(*inputs)
            out.backward(torch.ones_like(out))
            got = [out.detach()] + [t.grad for t in inputs]
            err = max(float((a.float() - b).abs().max() / b.abs().max()) for a, b in zip(got, ref, strict=True))
            inputs = [t.bfloat16().requires_grad_() for t in base]
            table.append((name, cname, timed(fn, inputs), err))
    start = time.perf_counter()
    for _ in range(10):
        attention.packed_masks(position_ids, 1024)
    torch.cuda.synchronize()
    print(f"packed_masks (both block masks): {(time.perf_counter() - start) / 10 * 1e3:.2f} ms")
    print("| layer | candidate | fwd+bwd ms | max rel error vs FP32 |")
    print("|---|---|---|---|")
    for row in table:
        print(f"| {row[0]} | {row[1]} | {row[2]:.2f} | {row[3]:.1e} |")


if __name__ == "__main__":
    main()
