"""Per-GPU memory and gradient all-reduce budget for LoRA (or full) fine-tuning of Gemma 4 under DDP.

    python memory_budget.py MODEL [--gpus-per-node 8] [--seq-len 2048] [--micro-batch 1] [--ckpt-every 1]
                                  [--ckpt-offload] [--optimizer-offload] [--ce-chunk-tokens 1024] [--json] ...

MODEL is a local folder (config.json + *.safetensors, sharded through model.safetensors.index.json
or not), a config.json alone (shapes then come from building the model on the meta device, e.g.
configs/gemma-4-12b.json), or a hub id (huggingface_hub fetches config.json and the safetensors
headers only). Weights are never read: every safetensors file starts with an 8-byte little-endian
length and a JSON header holding each tensor's name, dtype and shape.

Units: GB = 1e9 bytes, GiB = 2**30 bytes. A card sold as "80 GB" holds 80 GiB; --gpu-mem-gb means that.

The predicted peak is what torch.cuda.max_memory_allocated() reports after optimizer step 3 of
train_ddp.py: frozen weights in their stored dtype, but for the vision and audio embedders (text rows never run
them, and train_ddp.py leaves them out); LoRA adapters, their gradients and AdamW moments in FP32 (the moments
in pinned host memory between steps with --optimizer-offload); BF16 autocast with the backward pass outside it;
PEFT's LoRA path, eager or compiled layer by layer (--compile-layers); attention as attention.py runs it (--attention);
non-reentrant checkpointing of every Nth decoder layer (--ckpt-every N, 0: none), the checkpointed layers'
inputs kept on the GPU or offloaded to pinned host memory (--ckpt-offload); train_ddp.py's full-vocabulary
FP32 cross-entropy (over every position, or in checkpointed chunks of --ce-chunk-tokens); DDP with
gradient_as_bucket_view=True; every sample padded to --seq-len and every position a target (the worst case).

The layout options (--micro-batch, --ckpt-every, --ckpt-offload, --optimizer-offload, --ce-chunk-tokens) are
train_ddp.py's MICRO_BATCH, GRADIENT_CHECKPOINTING, CHECKPOINT_OFFLOAD, OPTIMIZER_OFFLOAD and CE_CHUNK_TOKENS,
with the same defaults; they describe every layout that train_ddp.py's MEMORY_TARGET_GIB planner
(plan_for_memory_target) can choose, and --memory-target-gib runs that planner.
"""

import argparse
import json
import math
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

GB, GiB = 1e9, 2**30
# train_ddp.py's default LORA_TARGETS (tests/test_memory_budget.py keeps them equal): the text decoder's linear
# layers. PEFT full-matches it against
# module names. In a model that keeps the vision/audio embedders, "all-linear" would also hit them, which a text
# batch never uses: a DDP error at step 2 (repro/02); train_ddp.load_model leaves them out.
DEFAULT_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
# the same modules of a text-only layout (gemma4_text): their names have no language_model
TEXT_ONLY_TARGETS = DEFAULT_TARGETS.replace(".*language_model", "")
# attention paths: the global layers' kernel of right-padded rows (ffpa, sdpa), transformers' dense masks
# (masked), or packed rows with every layer on flex_attention (flex)
ATTENTION_PATHS = ("ffpa", "sdpa", "masked", "flex")
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "BF16": 2,
    "F16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
TORCH_DTYPES = {
    "torch.float64": "F64",
    "torch.float32": "F32",
    "torch.bfloat16": "BF16",
    "torch.float16": "F16",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.bool": "BOOL",
}
FULL_FT_BYTES_PER_PARAM = 16  # BF16 weight 2 + BF16 grad 2 + FP32 master 4 + FP32 Adam moments 8
FRAGMENTATION = 0.05  # caching-allocator slack: reserved exceeds allocated by a few percent
CUDA_CONTEXT_BYTES = 0.5 * GiB  # CUDA context, cuBLAS/cuDNN handles: outside the allocator
NCCL_BYTES = 0.5 * GiB  # NCCL communicator buffers, only when world size > 1
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb
# cuBLAS workspaces come from PyTorch's caching allocator (so they count in max_memory_allocated): 32 MiB
# each on Hopper, one per handle, i.e. one for the forward thread and one for autograd's backward thread.
CUBLAS_WORKSPACE_BYTES = 2 * 32 * 2**20


# ---------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """How each GPU runs its samples: train_ddp.py's MICRO_BATCH, GRADIENT_CHECKPOINTING, CHECKPOINT_OFFLOAD,
    CE_CHUNK_TOKENS and OPTIMIZER_OFFLOAD, with their defaults. The CLI, the planner and the trainer all speak it."""

    micro_batch: int = 1  # samples per GPU per forward
    ckpt_every: int = 1  # checkpoint the decoder layers whose index is a multiple of this (0: none)
    offload: bool = False  # checkpointed layers keep their BF16 input in pinned host memory, not on the GPU
    ce_chunk_tokens: int = 1024  # loss over target positions in checkpointed chunks this long (0: all logits at once)
    optimizer_offload: bool = False  # AdamW's state waits in pinned host memory while forward and backward run

    def __post_init__(self):
        wrong = [
            f"{name} must be {rule} (got {value})"
            for name, value, ok, rule in (
                ("micro_batch", self.micro_batch, self.micro_batch >= 1, ">= 1"),
                ("ckpt_every", self.ckpt_every, self.ckpt_every >= 0, ">= 0 (0: no checkpointing)"),
                ("ce_chunk_tokens", self.ce_chunk_tokens, self.ce_chunk_tokens >= 0, ">= 0 (0: no chunking)"),
            )
            if not ok
        ]
        if wrong:
            raise ValueError("; ".join(wrong))


DEFAULT_LAYOUT = Layout()  # train_ddp.py's defaults


# ---------------------------------------------------------------- shapes, never weights


def read_safetensors_header(path) -> dict:
    """{name: (shape, dtype)} from one safetensors file, reading only its header."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return {name: (tuple(t["shape"]), t["dtype"]) for name, t in header.items()}


class ModelError(ValueError):
    """A model the budget cannot describe: not Gemma 4, a config.json without a field it reads, or LoRA targets
    that match no Linear module of it."""


# text-config fields read beyond the weights' shapes (building from config.json would default them silently)
# config.json model types of Gemma 4 (the text-only ones too); here, not in settings.py, so that this command line
# does not pay torch's import
GEMMA4_MODEL_TYPES = ("gemma4_unified", "gemma4", "gemma4_unified_text", "gemma4_text")
TEXT_FIELDS = ("num_attention_heads", "num_key_value_heads")


def load_config(path_or_id) -> dict:
    """config.json of a folder, a config.json path itself, or a hub id: a Gemma 4 one with TEXT_FIELDS."""
    path = Path(path_or_id)
    if path.is_dir():
        path = path / "config.json"
    elif not path.is_file():
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(str(path_or_id), "config.json")
    config = json.loads(Path(path).read_text())
    if config.get("model_type") not in GEMMA4_MODEL_TYPES:
        raise ModelError(
            f"{path} says model_type {config.get('model_type')!r}: memory_budget.py models Gemma 4 "
            f"({', '.join(GEMMA4_MODEL_TYPES)})"
        )
    missing = [k for k in TEXT_FIELDS if k not in (config.get("text_config") or config)]
    if missing:
        raise ModelError(f"{path} has no {', '.join(missing)} (of Gemma 4's text config)")
    return config


def param_shapes_from_model(model) -> dict:
    """{name: (shape, dtype)} of an in-memory nn.Module's base weights; meta tensors work too. A model
    with LoRA layers injected (PEFT's base model) reads as the model before PEFT."""
    return {
        name.replace(".base_layer", ""): (tuple(p.shape), TORCH_DTYPES[str(p.dtype)])
        for name, p in model.named_parameters()
        if "lora_" not in name
    }


def param_shapes_from_path(path_or_id) -> dict:
    """{name: (shape, dtype)} from a folder's safetensors headers, a bare config.json, or a hub id."""
    path = Path(path_or_id)
    if path.is_file() or (path.is_dir() and not list(path.glob("*.safetensors"))):
        return _shapes_from_config(path)
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        files = (
            sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if index.exists()
            else sorted(f.name for f in path.glob("*.safetensors"))
        )
        shapes = {k: v for f in files for k, v in read_safetensors_header(path / f).items()}
    else:
        from huggingface_hub import get_safetensors_metadata

        meta = get_safetensors_metadata(str(path_or_id))
        shapes = {
            name: (tuple(t.shape), t.dtype) for file in meta.files_metadata.values() for name, t in file.tensors.items()
        }
    return _module_names(shapes, load_config(path_or_id).get("model_type"))


def _shapes_from_config(config_path) -> dict:
    """Build the model on the meta device (no memory, no weights) and read its parameter shapes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(config_path)
    dtype = cfg.dtype if isinstance(cfg.dtype, torch.dtype) else getattr(torch, cfg.dtype or "bfloat16")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return param_shapes_from_model(model)


def _module_names(shapes: dict, model_type) -> dict:
    """Checkpoint keys -> parameter names: transformers renames a few keys on load
    (gemma4_unified: vision_embedder.* -> embed_vision.*), and PEFT matches the renamed ones."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        renames = [t for t in get_checkpoint_conversion_mapping(model_type) or [] if type(t) is WeightRenaming]
    except ImportError:  # another transformers version: keep the checkpoint's names
        return shapes
    out = {}
    for name, value in shapes.items():
        for rename in renames:
            name = rename.rename_source_key(name)[0]
        out[name] = value
    return out


# ---------------------------------------------------------------- parameters and LoRA


def _numel(shape) -> int:
    return math.prod(shape)


LEFT_OUT_GROUPS = ("vision", "audio")


def is_left_out(name: str) -> bool:
    """A parameter or module that train_ddp.py leaves out of the model: text rows never run it."""
    return _group(name) in LEFT_OUT_GROUPS


def _group(name: str) -> str:
    if "embed_tokens" in name or name.startswith("lm_head"):
        return "embeddings"
    return "vision" if "vision" in name else "audio" if "audio" in name else "language model"


def _modules(shapes: dict, tied: bool) -> dict:
    """{module name: (out, in)} for every 2-D `.weight` (Linear or Embedding). A tied lm_head has no
    tensor of its own in the checkpoint but is a module that PEFT can target."""
    mods = {n[: -len(".weight")]: s for n, (s, _) in shapes.items() if n.endswith(".weight") and len(s) == 2}
    if tied and "lm_head" not in mods:
        mods["lm_head"] = next(s for n, s in mods.items() if n.endswith("embed_tokens"))
    return mods


def is_targeted(module_name: str, targets) -> bool:
    """PEFT's matching: "all-linear" = every Linear but the output head; a string is a regex that must
    match the whole module name (re.fullmatch); a list matches a name or a dotted suffix."""
    if targets == "all-linear":
        return module_name != "lm_head" and not module_name.endswith("embed_tokens")
    if isinstance(targets, str):
        return re.fullmatch(targets, module_name) is not None
    return any(module_name == t or module_name.endswith("." + t) for t in targets)


def lora_params(shapes: dict, targets=DEFAULT_TARGETS, r: int = 16, tied: bool = True) -> dict:
    """{module name: r * (in + out)} over the modules LoRA wraps (lora_A is r x in, lora_B out x r)."""
    return {m: r * (o + i) for m, (o, i) in _modules(shapes, tied).items() if is_targeted(m, targets)}


def full_finetune_bytes(n_params: float) -> float:
    """Mixed-precision AdamW state before activations: 16 bytes per parameter."""
    return FULL_FT_BYTES_PER_PARAM * n_params


# ---------------------------------------------------------------- activations


def _decoder_layers(shapes: dict, text_config: dict, lora: dict, tp: int) -> list[dict]:
    """Per decoder layer: widths (divided over TP ranks), layer type and the in_features of its LoRA targets."""
    embed = next(n for n in shapes if n.endswith("embed_tokens.weight"))
    prefix = embed[: -len("embed_tokens.weight")] + "layers."
    n_layers = 1 + max(int(n[len(prefix) :].split(".")[0]) for n in shapes if n.startswith(prefix))
    heads = text_config["num_attention_heads"]
    types = text_config.get("layer_types") or ["full_attention"] * n_layers
    mods = _modules(shapes, tied=False)
    layers = []
    for i in range(n_layers):
        p = f"{prefix}{i}."
        q = mods[p + "self_attn.q_proj"][0]
        head_dim = q // heads
        k = mods.get(p + "self_attn.k_proj", (text_config["num_key_value_heads"] * head_dim,))[0]
        layers.append(
            dict(
                q=q / tp,
                kv=k / tp,
                heads=heads / tp,
                gqa=heads > k // head_dim,
                kv_heads=k // head_dim,
                head_dim=head_dim,
                has_kv_norms=p + "self_attn.k_proj" in mods,
                inter=mods[p + "mlp.gate_proj"][0] / tp,
                sliding=types[i] == "sliding_attention",
                # (the tensor each adapter reads, its width): q/k/v read one input, gate/up another
                lora_in=[
                    (
                        SHARED_INPUT.get(m.rsplit(".", 1)[-1], m),
                        mods[m][1] / (tp if m.endswith(("o_proj", "down_proj")) else 1),
                    )
                    for m in lora
                    if m.startswith(p)
                ],
                lora_params=sum(v for m, v in lora.items() if m.startswith(p)) / tp,
            )
        )
    return layers


# Adapters whose modules read the same input tensor (the others each read their own)
SHARED_INPUT = dict.fromkeys(("q_proj", "k_proj", "v_proj"), "attention input") | dict.fromkeys(
    ("gate_proj", "up_proj"), "MLP input"
)


def _layer_saved_per_token(
    layer: dict,
    hidden: int,
    seq_len: int,
    mask: bool,
    lora_r: int,
    lora_dropout: float,
    full: bool,
    grouped_kv: bool,
    compiled: bool,
) -> dict:
    """Bytes per token one decoder layer keeps for backward under BF16 autocast (no checkpointing).

    Autograd saves what each op's backward needs, and only for inputs that require grad, so a frozen
    Linear keeps its weight but not its input. Per Gemma 4 layer:
    - each RMSNorm upcasts its input and keeps that FP32 copy (4 on the hidden size; q_norm on q;
      k_norm and v_norm, which normalises the k_proj output in attention_k_eq_v layers, on k);
    - SDPA keeps q, k, v, its output (which is also o_proj's input) and an FP32 logsumexp per head.
      transformers repeats the KV heads into a BF16 copy unless SDPA may use enable_gqa (no mask and
      head_dim <= 256); a single KV head repeats as a free view. A dense mask becomes a BF16 bias of
      seq_len per token that the kernel keeps. FFPA (grouped_kv) takes the KV heads as they are;
    - the MLP keeps gelu's input and output and up_proj's output;
    - PEFT casts each LoRA input to FP32, applies dropout (CUDA keeps a 1-byte mask), and autocast casts
      the result to BF16 for lora_A, which keeps it; lora_B keeps lora_A's r-wide BF16 output;
    - full fine-tuning also keeps every Linear input and, for the trainable norm scales, their FP32 outputs.
    Compiled (COMPILE_LAYERS), inductor keeps each norm's BF16 input instead of its FP32 copy and recomputes gelu
    from gate_proj's output: 250.5 KB per token against 334.1 eager in a 12B sliding layer, 254.2 against
    343.8 in a global one (bench_results/issue24/saved_bytes.py), where this model says 255.5 and 265.1. Without
    LoRA dropout it also keeps one copy of the input q/k/v (and gate/up) share.
    """
    h, q, kv, inter = hidden, layer["q"], layer["kv"], layer["inter"]
    norm = 2 if compiled else 4
    # without dropout, the compiled layer keeps one BF16 copy of an input that several adapters read
    inputs = dict(layer["lora_in"]).items() if compiled and not lora_dropout else layer["lora_in"]
    repeat = layer["gqa"] and layer["kv_heads"] > 1 and (mask or layer["head_dim"] > 256) and not grouped_kv
    kv_norms = layer["has_kv_norms"]
    terms = {
        "RMSNorm inputs (FP32; BF16 compiled)": 4 * norm * h,
        "q/k/v-norm inputs (FP32; BF16 compiled)": norm * q + (2 * norm * kv if kv_norms else 0),
        "SDPA q, k, v, output (BF16)": 2 * q + 2 * 2 * (q if repeat else kv) + 2 * q,
        "SDPA logsumexp (FP32)": 4 * layer["heads"],
        "attention mask as BF16 bias": 2 * seq_len if mask else 0,
        "MLP gelu in/out, up_proj out (BF16; gelu in, up out compiled)": (2 if compiled else 3) * 2 * inter,
        "LoRA inputs (dropout mask + BF16 copy)": sum(3 * width if lora_dropout else 2 * width for _, width in inputs)
        + 2 * lora_r * len(layer["lora_in"]),
    }
    if full:
        terms["Linear inputs (BF16)"] = 2 * h + 2 * h + 2 * inter
        terms["norm outputs, trainable scales (FP32)"] = 4 * 4 * h + 4 * q + (4 * kv if kv_norms else 0)
    return terms


# ---------------------------------------------------------------- the estimate


def _activations(
    param_shapes: dict,
    text_config: dict,
    lora: dict,
    layout: Layout,
    *,
    seq_len: int,
    tp: int,
    lora_r: int,
    lora_dropout: float,
    full: bool,
    train_embeddings: bool,
    attention: str,
    compiled: bool,
) -> dict:
    """Activation memory of one micro-batch (bytes per GPU), term by term, before checkpointing decides
    which of the per-layer figures stay."""
    micro_batch, ce_chunk_tokens = layout.micro_batch, layout.ce_chunk_tokens
    fused_loss = compiled and ce_chunk_tokens > 0 and not (full or train_embeddings)  # lm_loss.CausalLMLoss.fused
    tokens = micro_batch * seq_len
    ce_tokens = min(tokens, ce_chunk_tokens) if ce_chunk_tokens > 0 else tokens
    embed_name = next(n for n in param_shapes if n.endswith("embed_tokens.weight"))
    vocab, hidden = param_shapes[embed_name][0]
    layers = _decoder_layers(param_shapes, text_config, lora, tp)
    window = text_config.get("sliding_window")

    def per_logit(fused: bool) -> int:  # cross-entropy bytes per position and vocabulary entry (see logits_ce)
        return (4 if text_config.get("final_logit_softcapping") else 0) + (2 + 4 + 4 if fused else 4 + 4 + 4)

    # Gemma4Unified's multimodal forward always passes a mask overlay, so transformers never takes the
    # is_causal shortcut: every layer gets a dense mask. Otherwise only sliding layers at >= window tokens.
    dense_masks = (
        embed_name.endswith("language_model.embed_tokens.weight")
        and text_config.get("use_bidirectional_attention") == "vision"
    )
    masked = [dense_masks or (layer["sliding"] and window is not None and seq_len >= window) for layer in layers]
    # train_ddp.py's global layers (attention.py) take a right-padded batch without a mask: "sdpa" with
    # is_causal (K/V still repeated at head_dim > 256), "ffpa" with grouped K/V, and with "ffpa" the sliding layers
    # too (FlashAttention-2's window, grouped K/V); "masked" is transformers' path. "flex": packed rows, every layer
    # on flex_attention's block masks (no dense mask, grouped K/V).
    fast = [attention in ("ffpa", "flex") or (attention == "sdpa" and not layer["sliding"]) for layer in layers]
    per_layer = [
        _layer_saved_per_token(
            layer,
            hidden,
            seq_len,
            m and not f,
            lora_r,
            lora_dropout,
            full,
            grouped_kv=f and attention in ("ffpa", "flex"),
            compiled=compiled,
        )
        for layer, m, f in zip(layers, masked, fast, strict=True)
    ]
    saved = [tokens * sum(t.values()) for t in per_layer]
    casts = [2 * layer["lora_params"] for layer in layers]  # autocast's BF16 copies of the FP32 adapter weights
    return {
        "terms": {k: tokens * sum(t[k] for t in per_layer) for k in per_layer[0]},
        "layers": saved,
        "all_layers": sum(saved) + sum(casts),
        "casts": casts,
        "one_layer": max(s + c for s, c in zip(saved, casts, strict=True)),
        # the boolean masks transformers builds once per layer type, kept to the end of backward where SDPA saves
        # them or a checkpointed layer's recompute holds them (layer 0 is always checkpointed); packed rows get
        # flex_attention's block masks instead (a few KiB)
        "masks": micro_batch
        * seq_len**2
        * len(
            {
                layer["sliding"]
                for layer, m, f in zip(layers, masked, fast, strict=True)
                if m and attention != "flex" and (layout.ckpt_every or not f)
            }
        ),
        "boundaries": len(layers) * 2 * hidden * tokens,  # checkpointing keeps each layer's BF16 input
        # the final norm's FP32 input; chunked loss (a gathered copy) or a trainable lm_head keep its BF16 output
        "final_norm": 4 * hidden * tokens
        + (2 * hidden * tokens if ce_chunk_tokens > 0 or full or train_embeddings else 0),
        # Cross-entropy backward over the full vocabulary (lm_head -> .float() -> softcap -> cross_entropy):
        # tanh's FP32 output (softcapping), the FP32 log-softmax output, its gradient and its input's gradient.
        # Compiled chunks with a frozen LM head (lm_loss.LinearCrossEntropy) take the gradient in the forward
        # pass: the BF16 logits, FP32 softcapped logits and log-probabilities, the FP32 gradient (measured 14.0
        # bytes per logit against 16.1 eager: bench_results/issue24/saved_bytes.py).
        "logits_ce": ce_tokens * vocab * per_logit(fused_loss),
        "logits_ce_unchunked": tokens * vocab * per_logit(False),  # CE_CHUNK_TOKENS=0: SPEC's 6-9 GB at 2,048
        # One layer's backward in flight: hidden-state gradients in and out (BF16) and two FP32 gradients
        # as wide as the MLP (down_proj's LoRA input, before and after dropout).
        "transient": tokens * (2 * 2 * hidden + 2 * 4 * max(layer["inter"] for layer in layers)),
    }


def _strategy(total: float, state: float, card: float, dp: int, tp: int) -> tuple[str, str]:
    """SPEC's decision: DDP if a replica (its 1/tp share per GPU) fits; FSDP/ZeRO if only gradients + optimizer
    state are too big; tensor/pipeline parallelism otherwise."""
    if total <= card:
        share = "one full replica" if tp == 1 else f"one GPU's 1/{tp} of a replica (TP {tp})"
        return "DDP", f"{share} needs {total / GiB:.1f} GiB of the {card / GiB:.1f} GiB card"
    if total - state <= card:
        sharded = total - state * (1 - 1 / dp)
        verdict = "" if sharded <= card else ", still too much: add GPUs"
        return "FSDP/ZeRO", (
            f"weights and activations fit ({(total - state) / GiB:.1f} GiB) but gradients and "
            f"optimizer state ({state / GiB:.1f} GiB) do not; sharded over DP={dp} they leave "
            f"{sharded / GiB:.1f} GiB per GPU{verdict}"
        )
    return "TP/PP", (
        f"weights and activations alone need {(total - state) / GiB:.1f} GiB, more than the "
        f"{card / GiB:.1f} GiB card: split layers (pipeline) or matrices (tensor parallel, --tp)"
    )


def estimate(
    param_shapes: dict,
    text_config: dict,
    layout: Layout,
    *,
    seq_len: int,
    world_size: int = 1,
    tp: int = 1,
    lora_r: int = 16,
    targets=DEFAULT_TARGETS,
    full: bool = False,
    train_embeddings: bool = False,
    gpu_mem_gb: float = 80.0,
    bus_bw_gbps: float = 100.0,
    accum: int = 1,
    lora_dropout: float = 0.05,
    attention: str = "ffpa",
    compiled: bool = False,
) -> dict:
    """Per-GPU memory, all-reduce and batch figures for one layout (compiled: COMPILE_LAYERS). "peak_bytes" predicts
    torch.cuda.max_memory_allocated() after optimizer step 3 (allocator margin excluded); "peak_breakdown"
    adds up to it.

    With TP every rank is taken to hold 1/tp of each weight and of the attention/MLP activations, while
    hidden-size activations and the gathered logits stay whole (no sequence parallelism)."""
    if attention not in ATTENTION_PATHS:
        raise ValueError(f"attention {attention!r}: one of {', '.join(ATTENTION_PATHS)}")
    text_config = text_config.get("text_config") or text_config
    if world_size % tp:
        raise ValueError(f"world size {world_size} is not a multiple of the tensor-parallel degree {tp}")
    dp = world_size // tp
    tied = text_config.get("tie_word_embeddings", True)
    n_params = sum(_numel(s) for s, _ in param_shapes.values())
    by_group, by_dtype = {}, {}
    for name, (shape, dtype) in param_shapes.items():
        by_group[_group(name)] = by_group.get(_group(name), 0) + _numel(shape)
        by_dtype[dtype] = by_dtype.get(dtype, 0) + _numel(shape)
    # what train_ddp.load_model keeps: not the vision and audio embedders (text rows never run them)
    param_shapes = {n: v for n, v in param_shapes.items() if not is_left_out(n)}
    n_loaded = sum(_numel(s) for s, _ in param_shapes.values())
    (vocab, hidden), embed_dtype = next(v for n, v in param_shapes.items() if n.endswith("embed_tokens.weight"))

    lora = {} if full else lora_params(param_shapes, targets, lora_r, tied)
    if not full and not lora and not train_embeddings:
        raise ModelError(f"LoRA targets {targets!r} match no Linear module")
    n_lora = sum(lora.values())
    # modules_to_save: PEFT trains a copy of the embedding (one copy when tied, with ensure_weight_tying)
    # in the stored dtype, beside the frozen original; AdamW keeps its moments in that dtype too.
    emb_copy = 0 if full or not train_embeddings else (1 if tied else 2) * vocab * hidden
    emb_bytes = emb_copy * DTYPE_BYTES[embed_dtype]

    persistent = {}  # bytes per GPU that persist across steps: weights, gradients, optimizer state
    if full:
        persistent["weights (BF16)"] = 2 * n_loaded / tp
        persistent["gradients (BF16)"] = 2 * n_loaded / tp
        persistent["AdamW: FP32 master + 2 moments"] = 12 * n_loaded / tp
    else:
        also = f" + embedding copy {embed_dtype}" if emb_copy else ""
        persistent["frozen weights"] = sum(_numel(s) * DTYPE_BYTES[d] for s, d in param_shapes.values()) / tp
        persistent[f"adapter weights (FP32{also})"] = (4 * n_lora + emb_bytes) / tp
        persistent[f"gradients (FP32{also})"] = (4 * n_lora + emb_bytes) / tp
        persistent[f"AdamW state (2 x FP32{also})"] = (8 * n_lora + 2 * emb_bytes) / tp
    grad_bytes = next(v for k, v in persistent.items() if k.startswith("gradients"))
    step_phase = {}
    if layout.optimizer_offload:  # AdamW's state comes to the GPU for the step only, when no activation is left
        adamw = next(k for k in persistent if k.startswith("AdamW"))
        step_phase["optimizer step"] = {f"{adamw}, over from the host": persistent.pop(adamw)}
        persistent[f"{adamw}: on the host between steps"] = 0
    state = grad_bytes + sum(v for k, v in persistent.items() if k.startswith("AdamW"))  # on the GPU throughout

    activations = _activations(
        param_shapes,
        text_config,
        lora,
        layout,
        seq_len=seq_len,
        tp=tp,
        lora_r=lora_r,
        attention=attention,
        lora_dropout=lora_dropout,
        full=full,
        train_embeddings=train_embeddings,
        compiled=compiled,
    )
    # The peak comes at the start of backward through the cross-entropy or, with small (chunked) logits,
    # inside a layer's backward (recomputed first when checkpointing). ckpt_every=n checkpoints the layers
    # whose index is a multiple of n (transformers' every_n_layers): they keep only their BF16 input,
    # in pinned host memory with offload.
    every = layout.ckpt_every
    boundary = 0 if layout.offload else activations["boundaries"] / len(activations["layers"])
    kept = (
        sum(
            boundary if every and i % every == 0 else saved + cast
            for i, (saved, cast) in enumerate(zip(activations["layers"], activations["casts"], strict=True))
        )
        + activations["masks"]
    )
    phases = {
        "cross-entropy backward": {
            "saved activations": kept + activations["final_norm"],
            "logits + cross-entropy buffers": activations["logits_ce"],
        },
        "decoder-layer backward": {
            "saved activations": kept,
            "one layer's recompute + backward": activations["transient"] + (activations["one_layer"] if every else 0),
        },
        **step_phase,
    }
    peak_phase = max(phases, key=lambda k: sum(phases[k].values()))
    breakdown = {
        **persistent,
        "DDP buckets (views of the gradients)": 0,
        "cuBLAS workspaces": CUBLAS_WORKSPACE_BYTES,
        **phases[peak_phase],
    }
    peak = sum(breakdown.values())
    margin = FRAGMENTATION * peak + CUDA_CONTEXT_BYTES + (NCCL_BYTES if world_size > 1 else 0)
    card, total = gpu_mem_gb * GiB, peak + margin
    strategy, reason = _strategy(total, state, card, dp, tp)
    ring = 2 * (dp - 1) / dp
    return {
        "settings": dict(
            seq_len=seq_len,
            micro_batch=layout.micro_batch,
            accum=accum,
            world_size=world_size,
            tp=tp,
            dp=dp,
            lora_r=lora_r,
            lora_dropout=lora_dropout,
            targets=targets,
            ckpt_every=layout.ckpt_every,
            ce_chunk_tokens=layout.ce_chunk_tokens,
            offload=layout.offload,
            optimizer_offload=layout.optimizer_offload,
            compiled=compiled,
            attention=attention,
            full=full,
            train_embeddings=train_embeddings,
            gpu_mem_gb=gpu_mem_gb,
            bus_bw_gbps=bus_bw_gbps,
        ),
        "params": {
            "total": n_params,
            "loaded": n_loaded,
            "by_group": by_group,
            "by_dtype": by_dtype,
            "under_language_model": sum(_numel(s) for n, (s, _) in param_shapes.items() if "language_model." in n),
            "vocab": vocab,
            "hidden": hidden,
            "layers": len(activations["layers"]),
            "tied_embeddings": tied,
        },
        "lora_params": n_lora,
        "lora_modules": len(lora),
        "trainable_params": n_loaded if full else n_lora + emb_copy,
        "bytes": persistent,
        "grad_bytes": grad_bytes,
        "activations_ckpt_bytes": activations["boundaries"]
        + activations["masks"]
        + activations["one_layer"]
        + activations["transient"],
        "activations_no_ckpt_bytes": activations["all_layers"] + activations["masks"],
        "activation_terms": activations["terms"],
        "layer_saved_bytes": activations["layers"],
        "logits_ce_bytes": activations["logits_ce"],
        "logits_ce_unchunked_bytes": activations["logits_ce_unchunked"],
        "peak_phase": peak_phase,
        "peak_breakdown": breakdown,
        "peak_bytes": peak,
        "allocator_margin_bytes": margin,
        "total_bytes": total,
        "card_bytes": card,
        "fits": total <= card,
        "strategy": strategy,
        "strategy_reason": reason,
        "ddp_buckets": math.ceil(grad_bytes / DDP_BUCKET_BYTES),
        "allreduce_ring_factor": ring,
        "allreduce_bytes": grad_bytes * ring,
        "allreduce_seconds": grad_bytes * ring / (bus_bw_gbps * GB),
        "global_batch": layout.micro_batch * accum * dp,
        "full_finetune_bytes": full_finetune_bytes(n_loaded),
    }


# ---------------------------------------------------------------- the planner (train_ddp.py's MEMORY_TARGET_GIB)

PREDICTION_MARGIN = 0.03  # measured on the H200: predictions 0.2-2.4% below max_memory_allocated (README)


def candidate_layouts(samples_per_step: int) -> list[Layout]:
    """Every layout the planner may choose for `samples_per_step` samples per GPU per optimizer step, fastest
    first. Speed order, from the H200 measurements: less recomputation first (no checkpointing, then every
    4th, 2nd, every layer, then every layer with its input offloaded to host memory), then larger
    micro-batches (dividing samples_per_step), then larger loss chunks, then AdamW's state on the GPU before
    in host memory (two PCIe copies of 8 bytes per adapter parameter each step)."""
    return [
        Layout(micro_batch=micro, ckpt_every=every, offload=offload, ce_chunk_tokens=chunk, optimizer_offload=host)
        for every, offload in ((0, False), (4, False), (2, False), (1, False), (1, True))
        for micro in (8, 4, 2, 1)
        if samples_per_step % micro == 0
        for chunk in (1024, 256, 64)
        for host in (False, True)
    ]


def plan_for_memory_target(
    param_shapes: dict, text_config: dict, target_gib: float, *, seq_len: int, samples_per_step: int, **kwargs
) -> dict:
    """The fastest layout predicted to fit `target_gib` of allocated memory per GPU, for a fixed number of
    samples per GPU per optimizer step (so the global batch, hence the training, is unchanged):
    {"layout": Layout, "accum": samples_per_step // micro_batch, "peak_bytes": its predicted peak}.
    kwargs go to estimate() (world_size, lora_r, targets, ...)."""
    smallest = math.inf
    for layout in candidate_layouts(samples_per_step):
        accum = samples_per_step // layout.micro_batch
        peak = estimate(param_shapes, text_config, layout, seq_len=seq_len, accum=accum, **kwargs)["peak_bytes"]
        smallest = min(smallest, peak)
        if peak * (1 + PREDICTION_MARGIN) <= target_gib * GiB:
            return {"layout": layout, "accum": accum, "peak_bytes": peak}
    raise ValueError(
        f"no layout fits {target_gib} GiB per GPU at {seq_len} tokens: the smallest needs "
        f"{smallest / GiB:.1f} GiB (+{PREDICTION_MARGIN:.0%} margin). DDP keeps a whole replica on every GPU, so "
        "more GPUs do not lower it: shorter rows (MAX_LEN), GPUs with more memory, or FSDP (which shards it)"
    )


def attention_of(run) -> str:
    """The attention path of a train_ddp.py run: packed rows run every layer on flex_attention."""
    return "flex" if run.PACKING else run.ATTENTION_KERNEL


def layout_of(run) -> Layout:
    """The layout a train_ddp.py run's settings describe (any object with its constant names)."""
    return Layout(
        run.MICRO_BATCH, run.GRADIENT_CHECKPOINTING, run.CHECKPOINT_OFFLOAD, run.CE_CHUNK_TOKENS, run.OPTIMIZER_OFFLOAD
    )


def estimate_run(run, param_shapes: dict, text_config: dict, world_size: int, **kwargs) -> dict:
    """estimate() for a train_ddp.py run's settings; kwargs override (seq_len: the longest padded batch)."""
    return estimate(
        param_shapes,
        text_config,
        layout_of(run),
        **{
            "seq_len": run.MAX_LEN,
            "world_size": world_size,
            "lora_r": run.LORA_R,
            "targets": run.LORA_TARGETS,
            "accum": run.ACCUM_STEPS,
            "lora_dropout": run.LORA_DROPOUT,
            "attention": attention_of(run),
            "compiled": run.COMPILE_LAYERS,
            **kwargs,
        },
    )


def predicted_peak_gib(run, model, world_size: int, seq_len: int) -> float:
    """The prediction of torch.cuda.max_memory_allocated() for a train_ddp.py run of `model` (its base model,
    built) at `seq_len` tokens: what the trainer logs beside the real peak at step 3."""
    return (
        estimate_run(run, param_shapes_from_model(model), model.config.to_dict(), world_size, seq_len=seq_len)[
            "peak_bytes"
        ]
        / GiB
    )


def plan_run(run, world_size: int) -> tuple[dict, str]:
    """train_ddp.py's MEMORY_TARGET_GIB: ({constant: value} of the layout chosen for `run`, one line saying
    its predicted peak). Raises ValueError when no layout fits."""
    source = run.MODEL_CONFIG or run.MODEL_ID
    plan = plan_for_memory_target(
        param_shapes_from_path(source),
        load_config(source),
        run.MEMORY_TARGET_GIB,
        seq_len=run.MAX_LEN,
        samples_per_step=run.MICRO_BATCH * run.ACCUM_STEPS,
        world_size=world_size,
        lora_r=run.LORA_R,
        targets=run.LORA_TARGETS,
        lora_dropout=run.LORA_DROPOUT,
        attention=attention_of(run),
        compiled=run.COMPILE_LAYERS,
    )
    layout = plan["layout"]
    chosen = {
        "MICRO_BATCH": layout.micro_batch,
        "ACCUM_STEPS": plan["accum"],
        "GRADIENT_CHECKPOINTING": layout.ckpt_every,
        "CHECKPOINT_OFFLOAD": layout.offload,
        "CE_CHUNK_TOKENS": layout.ce_chunk_tokens,
        "OPTIMIZER_OFFLOAD": layout.optimizer_offload,
    }
    return chosen, f"MEMORY_TARGET_GIB={run.MEMORY_TARGET_GIB}: predicted peak {plan['peak_bytes'] / GiB:.1f} GiB"


# ---------------------------------------------------------------- report


def _count(n: float) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e8 else f"{n / 1e6:.3f} M" if n >= 1e5 else f"{n:,.0f}"


def _describe_checkpointing(every: int, offload: bool) -> str:
    if not every:
        return "no gradient checkpointing"
    suffix = "th" if 10 <= every % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(every % 10, "th")
    nth = "" if every == 1 else f"{every}{suffix} "
    return f"gradient checkpointing of every {nth}layer" + (" (inputs offloaded to host)" if offload else "")


def format_report(result: dict) -> str:
    s, p = result["settings"], result["params"]

    def row(label: str, n: float) -> str:
        return f"  {label:<56}{n / GB:>9.2f} GB {n / GiB:>8.2f} GiB"  # a space even between huge figures

    mode = (
        "full fine-tuning"
        if s["full"]
        else f"LoRA r={s['lora_r']}" + (" + embeddings" if s["train_embeddings"] else "")
    )
    out = [
        f"Parameters: {_count(p['total'])} ({_count(p['under_language_model'])} under "
        f"model.language_model), {p['layers']} decoder layers, vocab {p['vocab']:,}, hidden {p['hidden']}"
    ]
    out += [
        f"  {g:<20}{_count(n):>12}" + ("  (left out: text rows only)" if g in LEFT_OUT_GROUPS else "")
        for g, n in sorted(p["by_group"].items(), key=lambda x: -x[1])
    ]
    out.append("  by dtype: " + ", ".join(f"{d} {_count(n)}" for d, n in p["by_dtype"].items()))
    if not s["full"]:
        out.append(
            f"LoRA r={s['lora_r']} on {result['lora_modules']} modules (targets {s['targets']!r}): "
            f"{result['lora_params']:,} trainable ({100 * result['lora_params'] / p['total']:.2f}%)"
        )
    out.append(
        f"\nPer GPU: {mode}{', layers compiled' if s['compiled'] else ''}, {s['attention']} attention, "
        f"micro-batch {s['micro_batch']} x "
        f"{s['seq_len']} tokens, "
        f"{_describe_checkpointing(s['ckpt_every'], s['offload'])}, "
        + ("AdamW state on the host between steps, " if s["optimizer_offload"] else "")
        + (f"loss in chunks of {s['ce_chunk_tokens']} tokens" if s["ce_chunk_tokens"] else "loss over all logits")
        + f", TP {s['tp']}, DP {s['dp']}"
    )
    out += [row(k, v) for k, v in result["peak_breakdown"].items()]
    out.append(
        row("predicted peak = torch.cuda.max_memory_allocated()", result["peak_bytes"])
        + f"  (in {result['peak_phase']})"
    )
    out.append(row("allocator margin (fragmentation, CUDA context, NCCL)", result["allocator_margin_bytes"]))
    out.append(
        row("total", result["total_bytes"])
        + f"  of {s['gpu_mem_gb']:g} GiB: "
        + ("fits" if result["fits"] else "DOES NOT FIT")
    )
    out.append("  for reference:")
    out.append(row("activations with checkpointing (one layer in flight)", result["activations_ckpt_bytes"]))
    out.append(row("activations without checkpointing", result["activations_no_ckpt_bytes"]))
    out.append(
        row(
            "logits + CE buffers unchunked (CE_CHUNK_TOKENS=0)",
            result["logits_ce_unchunked_bytes"],
        )
        + (
            f"  (chunks of {s['ce_chunk_tokens']}: {result['logits_ce_bytes'] / GB:.2f} GB, "
            f"{result['logits_ce_bytes'] / GiB:.2f} GiB)"
            if s["ce_chunk_tokens"]
            else ""
        )
    )
    out.append(row("full fine-tuning state, 16 B/param, before activations", result["full_finetune_bytes"]))
    out.append(f"\nStrategy: {result['strategy']}: {result['strategy_reason']}.")
    out.append(
        f"Gradient all-reduce per optimizer step: {result['grad_bytes'] / GB:.3f} GB of gradients "
        f"({result['ddp_buckets']} DDP buckets) x ring factor 2(N-1)/N = {result['allreduce_ring_factor']:.2f}"
        f" (N = DP = {s['dp']})\n  = {result['allreduce_bytes'] / GB:.3f} GB per GPU, "
        f"{1e3 * result['allreduce_seconds']:.1f} ms at {s['bus_bw_gbps']:g} GB/s bus bandwidth"
    )
    out.append(
        f"Global batch: micro {s['micro_batch']} x accumulation {s['accum']} x DP {s['dp']} "
        f"(= world {s['world_size']} / TP {s['tp']}) = {result['global_batch']} sequences per update"
    )
    return "\n".join(out)


def bounded(kind, low, high=math.inf, *, open_low=False):
    """An argparse type: a `kind` (int or float) from `low` (excluded if open_low) to below `high`; anything else
    is the option's one-line usage error, naming the range."""
    rule = f"{'>' if open_low else '>='} {low}" + (f" and < {high}" if high < math.inf else "")

    def check(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = math.nan  # fails both comparisons
        if not (low < value if open_low else low <= value) or not value < high:
            raise argparse.ArgumentTypeError(
                f"must be {'an integer' if kind is int else 'a number'} {rule} (got {text})"
            )
        return value

    return check


count, positive = bounded(int, 1), bounded(float, 0, open_low=True)  # a count; a size or a bandwidth


def regex(text: str) -> str:
    """An argparse type: a pattern that compiles."""
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression ({e})") from None
    return text


def model_source(text: str) -> str:
    """An argparse type: an existing path, or what can only be a hub id (name or owner/name, not a .json)."""
    if not text:  # Path("") is the current folder
        raise argparse.ArgumentTypeError("empty: give a model folder, a config.json or a hub id")
    if Path(text).is_dir() and not (Path(text) / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text}: no config.json in this folder")
    if not Path(text).exists() and (text.endswith(".json") or not re.fullmatch(r"[\w-][\w.-]*(/[\w.-]+)?", text)):
        raise argparse.ArgumentTypeError(f"{text}: no such file or folder")
    return text


def parser() -> argparse.ArgumentParser:
    """The command line; its defaults are train_ddp.py's (tests/test_memory_budget.py keeps them equal)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=model_source, help="local folder, config.json, or hub id")
    ap.add_argument("--gpus-per-node", type=count, default=1)
    ap.add_argument("--nodes", type=count, default=1)
    ap.add_argument(
        "--tp", type=count, default=1, help="tensor-parallel degree (DP = world size / TP; train_ddp.py has none)"
    )
    ap.add_argument("--seq-len", type=count, default=2048, help="tokens per sample after padding")
    ap.add_argument(
        "--micro-batch",
        type=count,
        default=DEFAULT_LAYOUT.micro_batch,
        help="samples per GPU per forward (train_ddp.py's MICRO_BATCH)",
    )
    ap.add_argument("--accum", type=count, default=8, help="gradient accumulation steps (ACCUM_STEPS)")
    ap.add_argument("--lora-r", type=count, default=16)
    ap.add_argument("--lora-dropout", type=bounded(float, 0, 1), default=0.05)
    ap.add_argument(
        "--targets", type=regex, default=DEFAULT_TARGETS, help='LoRA regex (full match, as PEFT) or "all-linear"'
    )
    ap.add_argument(
        "--ckpt-every",
        type=bounded(int, 0),
        default=DEFAULT_LAYOUT.ckpt_every,
        metavar="N",
        help="gradient checkpointing of every Nth decoder layer, 0: none (GRADIENT_CHECKPOINTING)",
    )
    ap.add_argument(
        "--no-grad-ckpt",
        dest="ckpt_every",
        action="store_const",
        const=0,
        default=DEFAULT_LAYOUT.ckpt_every,
        help="no gradient checkpointing (= --ckpt-every 0)",
    )
    ap.add_argument(
        "--ckpt-offload",
        action="store_true",
        default=DEFAULT_LAYOUT.offload,
        help="checkpointed layers keep their input in pinned host memory (CHECKPOINT_OFFLOAD)",
    )
    ap.add_argument(
        "--optimizer-offload",
        action="store_true",
        default=DEFAULT_LAYOUT.optimizer_offload,
        help="AdamW's state in pinned host memory between steps (OPTIMIZER_OFFLOAD)",
    )
    ap.add_argument(
        "--ce-chunk-tokens",
        type=bounded(int, 0),
        default=DEFAULT_LAYOUT.ce_chunk_tokens,
        help="loss in checkpointed chunks of this many target tokens, 0: all logits at once (CE_CHUNK_TOKENS)",
    )
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    ap.add_argument(
        "--train-embeddings", action="store_true", help="embed_tokens/lm_head trainable (PEFT modules_to_save)"
    )
    ap.add_argument("--gpu-mem-gb", type=positive, default=80.0, help='card memory as sold ("80 GB" = 80 GiB)')
    ap.add_argument("--bus-bw-gbps", type=positive, default=100.0, help="all-reduce bus bandwidth, GB/s")
    ap.add_argument(
        "--attention",
        choices=ATTENTION_PATHS,
        default="ffpa",
        help="global layers' kernel (train_ddp.py's ATTENTION_KERNEL; sdpa without ffpa-attn installed); "
        "flex: PACKING=1, every layer on flex_attention",
    )
    ap.add_argument(
        "--compile-layers", action="store_true", help="each decoder layer compiled (train_ddp.py's COMPILE_LAYERS)"
    )
    ap.add_argument(
        "--memory-target-gib",
        type=positive,
        default=0.0,
        metavar="GIB",
        help="train_ddp.py's MEMORY_TARGET_GIB: its planner chooses the layout options (keeping micro-batch x accum) "
        "and the report is of that layout",
    )
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    return ap


PLANNED_OPTIONS = {  # the layout MEMORY_TARGET_GIB's planner chooses: constant -> the option that sets it otherwise
    "MICRO_BATCH": "micro_batch",
    "ACCUM_STEPS": "accum",
    "GRADIENT_CHECKPOINTING": "ckpt_every",
    "CHECKPOINT_OFFLOAD": "ckpt_offload",
    "CE_CHUNK_TOKENS": "ce_chunk_tokens",
    "OPTIMIZER_OFFLOAD": "optimizer_offload",
}


def replaced_options(ap: argparse.ArgumentParser, args: argparse.Namespace, chosen: dict) -> list[str]:
    """The options set on the command line (to other than their default) that the planner's `chosen` replaces."""
    return [
        f"--{dest.replace('_', '-')}" + ("" if isinstance(getattr(args, dest), bool) else f" {getattr(args, dest)}")
        for name, dest in PLANNED_OPTIONS.items()
        if getattr(args, dest) != ap.get_default(dest) and getattr(args, dest) != chosen[name]
    ]


def run_of(args: argparse.Namespace) -> SimpleNamespace:
    """The train_ddp.py settings the command line describes, by the constant names estimate_run and plan_run read."""
    return SimpleNamespace(
        MODEL_ID=args.model,
        MODEL_CONFIG="",
        MEMORY_TARGET_GIB=args.memory_target_gib,
        MAX_LEN=args.seq_len,
        **{name: getattr(args, dest) for name, dest in PLANNED_OPTIONS.items()},
        LORA_R=args.lora_r,
        LORA_TARGETS=args.targets,
        LORA_DROPOUT=args.lora_dropout,
        ATTENTION_KERNEL=args.attention,
        PACKING=args.attention == "flex",
        COMPILE_LAYERS=args.compile_layers,
    )


def warnings_for(args: argparse.Namespace, result: dict, config: dict) -> list[str]:
    """Values the budget models but a run would not want, and an assumption that multi-node runs rarely meet."""
    hidden, context = result["params"]["hidden"], (config.get("text_config") or config).get("max_position_embeddings")
    return [
        text
        for text, wrong in (
            (
                f"--lora-r {args.lora_r} is above the hidden size {hidden}: no adapted matrix has that rank",
                not args.full and args.lora_r > hidden,
            ),
            (
                f"--seq-len {args.seq_len} is beyond the model's max_position_embeddings {context}",
                context and args.seq_len > context,
            ),
            (
                f"--bus-bw-gbps {args.bus_bw_gbps:g} is taken across {args.nodes} nodes too: inter-node links are "
                "usually slower, give theirs",
                args.nodes > 1 and args.bus_bw_gbps == parser().get_default("bus_bw_gbps"),
            ),
        )
        if wrong
    ]


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    world = args.gpus_per_node * args.nodes
    if world % args.tp:
        ap.error(f"--tp {args.tp} does not divide the world size {world} (--gpus-per-node x --nodes)")
    if args.memory_target_gib and (args.tp > 1 or args.full or args.train_embeddings):
        ap.error("--memory-target-gib plans train_ddp.py's runs, which have no --tp, --full or --train-embeddings")
    if args.memory_target_gib > args.gpu_mem_gb:  # planned for a bigger card, then judged on this one
        default = " (its default)" if args.gpu_mem_gb == ap.get_default("gpu_mem_gb") else ""
        ap.error(
            f"--memory-target-gib {args.memory_target_gib:g} is more than the card's memory, --gpu-mem-gb "
            f"{args.gpu_mem_gb:g}{default}: give your card's, e.g. --gpu-mem-gb 141 for an H200"
        )
    try:
        config = load_config(args.model)  # first: another architecture is said before anything is built
        shapes = param_shapes_from_path(args.model)
    except ModelError as e:
        ap.error(str(e))
    except Exception as e:  # no such folder or hub id, no network, a gated model without a token: one line
        hub = (
            "" if Path(args.model).exists() else "; a hub id needs the network (or HF_HUB_OFFLINE=1 and a cached copy)"
        )
        print(
            f"error: {args.model}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{hub}", file=sys.stderr
        )
        return 2
    run = run_of(args)
    try:  # the trainer's own planner call; its choice is then reported like any layout
        chosen, line = plan_run(run, world) if run.MEMORY_TARGET_GIB else ({}, "")
        vars(run).update(chosen)
        result = estimate_run(
            run,
            shapes,
            config,
            world,
            tp=args.tp,
            full=args.full,
            train_embeddings=args.train_embeddings,
            gpu_mem_gb=args.gpu_mem_gb,
            bus_bw_gbps=args.bus_bw_gbps,
        )
    except ModelError as e:  # LoRA targets: known only once the shapes are
        text_only = "" if "text_config" in config else f"; in a text-only layout try --targets '{TEXT_ONLY_TARGETS}'"
        ap.error(f"{e}{text_only}")
    except ValueError as e:  # the planner's: no layout fits the target (any other is a bug: its traceback)
        if not args.memory_target_gib:
            raise
        ap.error(f"--memory-target-gib {args.memory_target_gib:g}: {e}")
    for text in warnings_for(args, result, config):
        print(f"warning: {text}", file=sys.stderr)
    if chosen:
        replaced = replaced_options(ap, args, chosen)
        result["plan"] = {"MEMORY_TARGET_GIB": args.memory_target_gib, **chosen, "replaced_options": replaced}
        line = f"planner: {line} with {' '.join(f'{k}={v}' for k, v in chosen.items())}" + (
            f" (replacing {', '.join(replaced)})\n" if replaced else "\n"
        )
    print(json.dumps(result, indent=2) if args.json else f"{args.model}\n{line}{format_report(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
