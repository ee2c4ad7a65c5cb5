"""Issue 25, session 7: which GPU attention path turns padding queries with no key into NaN gradients?

    python bench_results/issue25/nan_probe.py      (CUDA; prints one table)

1. Raw SDPA, BF16, a sliding-layer shape (16 heads, head_dim 256, 2,048 tokens), a boolean mask of causal & window
   & padding keys in which the short rows' padding queries past the window see no key: forward and backward under
   each backend SDPA offers, one at a time, and the default choice; is the output and q/k/v grad finite?
2. The 12B's sliding+global layer pair (tests/test_attention.py) with LoRA, through CausalLMLoss with the padding
   mask (right_padded=False, what every sliding layer got before the fix) and without (right_padded=True, now):
   is every LoRA gradient finite, for a few row mixes and windows?
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def raw_sdpa(lengths, window, backend):
    torch.manual_seed(0)
    b, h, kv, d, width = len(lengths), 16, 8, 256, max(lengths)
    q = torch.randn(b, h, width, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, kv, width, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, kv, width, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    i = torch.arange(width, device="cuda")
    real = i[None, :] < torch.tensor(lengths, device="cuda")[:, None]
    mask = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window))[None, None] & real[:, None, None, :]
    keyless = int((~mask.any(-1)).sum())
    kk, vv = k.repeat_interleave(h // kv, 1), v.repeat_interleave(h // kv, 1)
    try:
        ctx = sdpa_kernel([backend]) if backend is not None else torch.enable_grad()
        with ctx:
            out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
            # the loss reads real positions only, as the LM loss does (labels -100 on padding)
            (out * real[:, None, :, None]).float().sum().backward()
    except RuntimeError as e:
        return keyless, f"not run: {str(e).splitlines()[0][:60]}"
    fin = lambda t: bool(torch.isfinite(t).all())  # noqa: E731
    return keyless, f"out {fin(out)} dq {fin(q.grad)} dk {fin(k.grad)} dv {fin(v.grad)}"


def model_case(lengths, window, right_padded):
    import test_attention as ta
    from transformers import AutoConfig, AutoModelForCausalLM

    import attention

    config = ta.gemma4_12b_layer_pair()
    config["text_config"]["sliding_window"] = window
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(**config), dtype=torch.bfloat16, attn_implementation=attention.register("sdpa")
        )
    model = ta.with_lora(base)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, grads = ta.loss_and_grads(model, ta.random_right_padded(model.config, lengths), right_padded)
    bad = sum(not bool(torch.isfinite(g).all()) for g in grads)
    return f"loss finite {bool(torch.isfinite(loss))}, {bad} of {len(grads)} LoRA grads non-finite"


def main():
    print(torch.__version__, torch.cuda.get_device_name(), "cudnn", torch.backends.cudnn.version())
    rows = []
    for lengths in ([2048, 2048, 600, 100], [1536, 300]):
        for backend in (None, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
            keyless, result = raw_sdpa(lengths, 1024 if max(lengths) == 2048 else 512, backend)
            rows.append((f"raw SDPA {lengths}", backend.name if backend else "default", keyless, result))
    for lengths, window in (([1536, 300], 512), ([2048, 2048, 600, 100], 1024), ([2048, 1900, 900, 700], 1024)):
        for right_padded in (False, True):
            what = "padding mask (before)" if not right_padded else "no padding mask (now)"
            rows.append((f"layer pair {lengths} w{window}", what, "", model_case(lengths, window, right_padded)))
    print("| case | path | keyless query rows | finite? |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")


if __name__ == "__main__":
    main()
