"""Attention per layer type: a causal kernel without a dense mask for Gemma 4's global layers.

Gemma 4's global (full_attention) layers have head_dim 512, beyond SDPA's flash and cuDNN kernels (256),
and transformers gives every layer a dense boolean mask. So these layers (8 of 48 in the 12B) run SDPA's
generic kernel with K/V repeated to every query head: 20.6 ms forward+backward per layer for 2 x 2,048
tokens on an H200, against 12.8 ms with a causal flag instead of the mask and 4.95 ms with FFPA
(bench_results/README.md).

A right-padded batch (collate.py pads on the right) needs no mask in a global layer: a real token's keys
are itself and the tokens before it, all real, which is exactly the causal mask, and padding positions
come after every real token, so what they compute never reaches a real token or the loss (label -100).
For such batches the global layers run one of these KERNELS, causal and without a mask:
  ffpa  ffpa-attn's Triton kernel, K/V not repeated (GPU only; requirements-gpu.txt)
  sdpa  SDPA with is_causal, K/V repeated (anywhere)
In the real step (12B, fast layout, compiled, 1 H200) ffpa gave 6,879 target tokens/s, flex_attention with
a causal block mask and 32x32 tiles 6,523, SDPA is_causal 5,973 (bench_results/h200-issue10).
The same argument holds in a sliding layer with the window added: a real token sees itself and the tokens
before it within the window, all real. With ffpa, the sliding layers of right-padded batches run torch's own
FlashAttention-2 with its native window (no dense mask, K/V not repeated, the key blocks outside the window
skipped): 2.35 ms forward+backward per layer for 4 x 2,048 tokens on an H200 against 5.28 ms for SDPA with
transformers' mask (bench_results/issue24/sliding_kernels.txt). With sdpa, and for every batch that is not
right-padded (left-padded rows), the sliding layers keep transformers' SDPA with its mask. The trainer passes
right_padded=True only after checking the batch.

Packed rows (packing.py: conversations side by side, position_ids restarting at each) get packed_masks(): in
every layer a token sees only its own conversation, causally, and in sliding layers only the last
`sliding_window` tokens of it. On CUDA these are flex_attention block masks, so a row of short conversations
computes only the blocks on its diagonal; elsewhere (CPU) the same rule as dense boolean masks for SDPA.
"""

import functools

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask, flex_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

KERNELS = ("auto", "ffpa", "sdpa")
IMPLEMENTATION = "global_layers_causal"  # the attn_implementation name the model is loaded with
FLEX_TILES_D512 = {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1}  # flex's default tiles need 262 KB of shared
# memory at head_dim 512 (the global layers); head_dim 256 (the sliding layers) keeps flex's own choice


def ffpa_version() -> str | None:
    try:
        import ffpa_attn
    except ImportError:
        return None
    return ffpa_attn.__version__


def choose(kernel: str, device: torch.device, packing: bool = False) -> tuple[str, str]:
    """(the kernel the global layers of right-padded rows will use, one line saying which and why, and with
    packing what packed rows run). Raises ValueError for a kernel this machine cannot run."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}: allowed {', '.join(KERNELS)}")
    version = ffpa_version()
    if kernel == "ffpa" and device.type != "cuda":
        raise ValueError(f"{kernel} needs a CUDA device; this run is on {device.type} (use auto or sdpa)")
    if kernel == "ffpa" and version is None:
        raise ValueError("ffpa-attn is not installed: pip install -r requirements-gpu.txt (or use auto)")
    if kernel == "auto":
        kernel = "ffpa" if device.type == "cuda" and version else "sdpa"
        why = {
            "ffpa": "auto: ffpa-attn is installed",
            "sdpa": "auto: no CUDA device"
            if device.type != "cuda"
            else "auto: ffpa-attn is not installed (pip install -r requirements-gpu.txt for a 4x faster kernel)",
        }[kernel]
    else:
        why = "requested"
    name = {
        "ffpa": f"ffpa-attn {version} (Triton; it hands sequences under 512 tokens to SDPA) and sliding layers on "
        f"FlashAttention-2's native window",
        "sdpa": "SDPA is_causal and sliding layers on SDPA with transformers' mask",
    }[kernel]
    packed = "flex_attention block masks" if device.type == "cuda" else "SDPA with dense masks (no CUDA device)"
    return kernel, (
        f"attention: global layers on {name} for right-padded batches ({why}); other batches on SDPA with "
        f"transformers' mask" + (f"; packed rows on {packed}" if packing else "")
    )


def register(kernel: str) -> str:
    """Route the global layers of right-padded batches to `kernel` (from choose()), and with ffpa their sliding
    layers to FlashAttention-2's window where this GPU runs it (Ampere or newer; else SDPA with the mask); returns
    the attn_implementation to load the model with. The masks stay exactly SDPA's."""
    assert kernel in KERNELS[1:], f"register() takes choose()'s kernel, not {kernel!r}"
    window = kernel == "ffpa" and torch.cuda.get_device_capability() >= (8, 0)
    AttentionInterface.register(IMPLEMENTATION, functools.partial(attention, kernel=kernel, sliding_flash=window))
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    return IMPLEMENTATION


def attention(
    module,
    query,
    key,
    value,
    attention_mask,
    *,
    kernel: str,
    sliding_flash: bool = False,
    right_padded: bool = False,
    sliding_window=None,
    dropout: float = 0.0,
    scaling=None,
    **kwargs,
):
    """transformers' attention interface: (module, q, k, v, mask, **kwargs) -> (output [B, L, H, D], None)."""
    if isinstance(attention_mask, BlockMask):  # packed rows on CUDA (packed_masks)
        if dropout > 0:
            raise ValueError("packed rows run flex_attention, which has no attention dropout")
        return _flex(query, key, value, attention_mask, scaling), None
    maskless = right_padded and dropout == 0 and getattr(module, "is_causal", True)  # the argument above holds
    flash = sliding_flash and query.shape[-1] <= 256 and query.dtype in (torch.bfloat16, torch.float16)
    if maskless and sliding_window is not None and flash:
        return SlidingWindowFlash.apply(query, key, value, sliding_window, scaling), None
    if not maskless or sliding_window is not None:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            sliding_window=sliding_window,
            dropout=dropout,
            scaling=scaling,
            **kwargs,
        )
    if kernel == "sdpa":  # no mask: transformers' SDPA path then uses is_causal
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    from ffpa_attn import ffpa_attn_func

    out = ffpa_attn_func(query, key, value, is_causal=True, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


class SlidingWindowFlash(torch.autograd.Function):
    """A sliding layer of right-padded rows on torch's FlashAttention-2 with its native window: key kv is seen by
    query q when q - window < kv <= q, transformers' sliding rule. GQA as is (no K/V repeat), no dense mask, and
    the key blocks outside the window are skipped. q, k, v come [B, heads, L, D] (transformers' layout); the
    output goes back [B, L, heads, D], as the attention interface returns it. Dynamo traces it inside
    COMPILE_LAYERS' graphs (both aten ops have fake kernels)."""

    @staticmethod
    def forward(ctx, query, key, value, window: int, scale: float | None):
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # flash's [B, L, heads, D]
        length = q.shape[1]
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, length, length, 0.0, True, False,
            scale=scale, window_size_left=window - 1, window_size_right=0,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, rng, unused)
        ctx.window, ctx.scale = window, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, rng, unused = ctx.saved_tensors
        length = q.shape[1]
        grads = torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, None, None, length, length, 0.0, True, rng, unused,
            scale=ctx.scale, window_size_left=ctx.window - 1, window_size_right=0,
        )  # fmt: skip
        return *(g.transpose(1, 2) for g in grads), None, None


def packed_masks(position_ids: torch.Tensor, sliding_window: int) -> dict:
    """Each layer type's mask for packed rows (position_ids restart at 0 at each conversation; the padding at a
    row's end is one more): a token sees the tokens before it in its own conversation, in sliding layers only the
    last `sliding_window` of them (transformers' window: q - kv < sliding_window). Gemma 4's decoder takes the
    dict as is. CUDA: flex BlockMasks; elsewhere: boolean [B, 1, L, L] masks for SDPA, from the same rule."""
    conversation = (position_ids == 0).cumsum(-1)

    def causal(b, h, q, kv):
        return (conversation[b, q] == conversation[b, kv]) & (kv <= q)

    def sliding(b, h, q, kv):
        return causal(b, h, q, kv) & (q - kv < sliding_window)

    rows, length = position_ids.shape
    if position_ids.device.type == "cuda":
        make = functools.partial(create_block_mask, B=rows, H=None, _compile=True)
    else:
        make = functools.partial(create_mask, B=rows, H=1)
    return {
        name: make(rule, Q_LEN=length, KV_LEN=length, device=position_ids.device)
        for name, rule in (("full_attention", causal), ("sliding_attention", sliding))
    }


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)  # flex is fast only compiled; one shape per MAX_LEN


@torch.compiler.disable  # inside COMPILE_LAYERS' graphs too, flex runs as its own compiled kernel
def _flex(query, key, value, block_mask, scale):
    tiles = FLEX_TILES_D512 if query.shape[-1] > 256 else None
    out = _compiled_flex()(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=True, kernel_options=tiles)
    return out.transpose(1, 2).contiguous()
