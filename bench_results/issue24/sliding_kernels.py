"""Issue 24 lever: the sliding layers' attention (12B: 40 of 48 layers, window 1,024, head_dim 256, 16 query
and 8 K/V heads) on right-padded rows of 2,048 tokens. Today: SDPA with transformers' dense sliding mask and K/V
repeated (what attention.py leaves them on). Against: SDPA is_causal (a full causal square, not the window: a
speed reference only) and torch's own FlashAttention-2 with its native window (aten._flash_attention_forward,
window_size_left = window - 1), which skips the key blocks outside the window and takes GQA as is.

    python bench_results/issue24/sliding_kernels.py [--batch 4]

Prints forward+backward ms per layer call for each, and each one's largest difference to today's path (output
and the three gradients, relative to the largest value of each).
"""

import argparse

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--length", type=int, default=2048)
ap.add_argument("--window", type=int, default=1024)
args = ap.parse_args()
B, L, H, KV, D, W = args.batch, args.length, 16, 8, 256, args.window
torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
q = torch.randn(B, H, L, D, device=dev, dtype=dt)
k = torch.randn(B, KV, L, D, device=dev, dtype=dt)
v = torch.randn(B, KV, L, D, device=dev, dtype=dt)
grad = torch.randn(B, H, L, D, device=dev, dtype=dt)
i = torch.arange(L, device=dev)
mask = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < W))[None, None].expand(B, 1, L, L)
scale = D**-0.5


def sdpa_mask(q, k, v):
    return F.scaled_dot_product_attention(
        q, k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1), attn_mask=mask, scale=scale
    )


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)


class FlashWindow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):  # [B, H, L, D] in and out, as SDPA; flash works on [B, L, H, D]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, L, L, 0.0, True, False, scale=scale, window_size_left=W - 1, window_size_right=0
        )
        ctx.save_for_backward(q, k, v, out, lse, rng, unused)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            g.transpose(1, 2).contiguous(),
            q,
            k,
            v,
            out,
            lse,
            None,
            None,
            L,
            L,
            0.0,
            True,
            rng,
            unused,
            scale=scale,
            window_size_left=W - 1,
            window_size_right=0,
        )
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def run(fn):
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(qq, kk, vv)
    out.backward(grad)
    return [out.float(), qq.grad.float(), kk.grad.float(), vv.grad.float()]


def ms(fn, reps=20):
    for _ in range(3):
        run(fn)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run(fn)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


reference = run(sdpa_mask)
print(f"B={B} L={L} heads {H}/{KV} head_dim {D} window {W}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
print("| path | fwd+bwd ms per layer | vs today | max rel diff (out, dq, dk, dv) |")
print("|---|---|---|---|")
base = ms(sdpa_mask)
for name, fn in (
    ("SDPA + dense sliding mask (today)", sdpa_mask),
    ("SDPA is_causal (full square)", sdpa_causal),
    ("flash-2 native window", FlashWindow.apply),
):
    t = base if fn is sdpa_mask else ms(fn)
    diffs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(run(fn), reference, strict=True)]
    print(f"| {name} | {t:.2f} | {base / t:.2f}x | {', '.join(f'{d:.1e}' for d in diffs)} |")
