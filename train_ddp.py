"""LoRA fine-tuning of Gemma 4 with PyTorch DistributedDataParallel.

    torchrun --standalone --nproc_per_node=2 train_ddp.py               # embedded tiny default, CPU ok
    MODEL_ID=google/gemma-4-12B-it DATA_PATH=chat.jsonl torchrun --nproc_per_node=8 train_ddp.py

The story of one DDP job, top to bottom: the constants, process-group init, regex-scoped LoRA, the
DistributedSampler loader, forward_backward with no_sync, rank-0 checkpoints, then main(). Every constant
can be overridden by an environment variable of the same name (torchrun passes the environment to every
rank; the first collective checks that all ranks read the same values). The machinery lives beside it:
settings.py (reading and checking the constants), guards.py (hangs, preemption, failure reports),
chat_data.py and collate.py (the data), lm_loss.py (the loss DDP wraps), logs.py (metrics), run_record.py
(run identity, atomic saves), memory_budget.py (the planner).
"""

import dataclasses
import functools
import math
import os
import re
import socket
import sys
import time
import warnings
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import attention
import guards
import memory_budget
import run_record
import settings
from chat_data import (
    ChatDataset,
    chat_tokenizer,
    control_tokens,
    data_summary,
    eval_rows_cut,
    fields_left_out,
    held_out_copies,
    inline_reasoning,
    lengths_file,
    load_conversations,
    tokenizer_sha256,
)
from collate import IGNORE_INDEX, PadCollate, StepOrder
from guards import InputError
from lm_loss import CausalLMLoss
from logs import StepLog, is_rank0, profiled, say, seconds_since_launch, where_everything_is
from packing import PackCollate, PackedRows, rows_of_epoch

HERE = Path(__file__).resolve().parent
# Two known, harmless deprecations every rank would print: PEFT reads transformers' old
# is_gradient_checkpointing, and torch 2.13 renames DDP's broadcast_buffers (torch 2.11 knows only it).
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)


# ----------------------------------------------------------------------------------------------
# Constants: edit the defaults here, or override any with NAME=value in the environment
@dataclasses.dataclass(frozen=True)
class Config:
    MODEL_ID: str = str(HERE / "assets" / "tiny-gemma4")  # production: google/gemma-4-12B-it
    MODEL_CONFIG: str = ""  # a config.json: build that architecture with random weights (benchmarks)
    DATA_PATH: str = str(HERE / "assets" / "sample_chat.jsonl")  # chat JSONL, one {"messages": [...]} per line
    EVAL_PATH: str = ""  # optional held-out chat JSONL
    OUTPUT_DIR: str = "out"  # on shared storage for multi-node runs (checkpoints, metrics, adapter)
    MAX_LEN: int = 2048  # tokens per sample after the chat template; longer samples are truncated
    ASSISTANT_ONLY_LOSS: bool = True  # train on assistant turns only (prompt labels -100)
    MICRO_BATCH: int = 1  # samples per rank per forward
    ACCUM_STEPS: int = 8  # micro-batches per optimizer step; global batch = MICRO_BATCH*ACCUM_STEPS*world
    EPOCHS: int = 2
    MAX_STEPS: int = 0  # stop after this many optimizer steps (0: run all epochs)
    LR: float = 2e-4
    WARMUP_STEPS: int = 2  # linear warmup, then cosine decay to 0
    WEIGHT_DECAY: float = 0.0
    GRAD_CLIP: float = 1.0  # 0: no clipping
    LORA_R: int = 16
    LORA_ALPHA: int = 32
    LORA_DROPOUT: float = 0.05
    # A regex PEFT full-matches against module names: the text decoder's q/k/v/o and MLP projections (the
    # vision and audio towers' Linear layers never run on text rows: DDP would wait for their gradients)
    LORA_TARGETS: str = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    GRADIENT_CHECKPOINTING: int = 1  # checkpoint every Nth decoder layer: 1 all, 2 half, 0 none
    CHECKPOINT_OFFLOAD: bool = False  # keep checkpointed layer inputs in pinned host memory
    OPTIMIZER_OFFLOAD: bool = False  # keep AdamW's moments in pinned host memory between optimizer steps
    # Per-GPU memory target (GiB of allocated memory). When set, memory_budget.py picks MICRO_BATCH (keeping
    # MICRO_BATCH*ACCUM_STEPS), GRADIENT_CHECKPOINTING, CHECKPOINT_OFFLOAD, CE_CHUNK_TOKENS and OPTIMIZER_OFFLOAD:
    # the fastest layout predicted to fit. E.g. 24.5 = frugal, 130 = fast on an H200; 0 = use the constants as set.
    MEMORY_TARGET_GIB: float = 0.0
    # Right-padded batches: "ffpa" = global layers (head_dim 512) on ffpa-attn, sliding layers on FlashAttention-2's
    # native window; "sdpa" = SDPA, causal without a mask in global layers; "auto" = ffpa on a GPU with ffpa-attn
    # installed, else sdpa (attention.py).
    ATTENTION_KERNEL: str = "auto"
    COMPILE_LAYERS: bool = False  # torch.compile each decoder layer (regional): fuses norms, rotary, gelu
    CE_CHUNK_TOKENS: int = 1024  # loss over target positions only, in chunks; 0 = full FP32 logits
    LORA_BF16_INPUTS: bool = True  # skip PEFT's FP32 copy of each adapter input (autocast runs bf16 anyway)
    GROUP_BY_LENGTH: bool = True  # similar lengths share a micro-batch (within one optimizer step)
    # Whole conversations side by side in rows of MAX_LEN tokens, attention inside each (packing.py); MICRO_BATCH
    # then counts rows. No padding to speak of, for chat data of varied lengths.
    PACKING: bool = False
    PAD_TO_MULTIPLE: int = 64  # fewer distinct shapes: kernels (cuDNN attention) plan once per shape
    SEED: int = 1234
    NUM_WORKERS: int = 2  # DataLoader workers per rank (tokenization happens there)
    LOG_EVERY: int = 1
    PROFILE_STEP: int = 0  # profile this optimizer step: kernel table on rank 0, trace in OUTPUT_DIR
    EVAL_EVERY: int = 0  # optimizer steps between evaluations (0: only at the end, if EVAL_PATH)
    SAVE_EVERY: int = 0  # optimizer steps between checkpoints (0: only at epoch ends)
    KEEP_CHECKPOINTS: int = 2  # newest periodic checkpoints kept (at least 1)
    RESUME: str = "auto"  # "auto": newest intact checkpoint of this run in OUTPUT_DIR; "": never; or a path
    RESUME_ALLOW_CHANGES: bool = False  # continue a checkpoint of other settings (LR, EPOCHS, data)
    SAVE_ON_SIGTERM: bool = True  # SIGTERM/Ctrl-C/SIGHUP: finish the step, checkpoint, exit 0 (0: die at once)
    NAN_POLICY: str = "skip"  # non-finite loss/grad on any rank: "skip" the update or "stop"
    DRIFT_CHECK_EVERY: int = 50  # compare adapter checksums across ranks (0: only at the end)
    DIST_TIMEOUT_S: int = 300  # a collective stuck this long after step 1, or a wait for loader workers, ends the job
    DIST_INIT_TIMEOUT_S: int = 1800  # until step 1 is done (ranks load and compile at their own pace)


# What each constant allows, where not every value of its type makes sense (checked for overrides).
ALLOWED = {
    "MODEL_ID": (bool, "a model folder or hub id"),
    "DATA_PATH": (bool, "a chat JSONL file"),
    "OUTPUT_DIR": (bool, "a folder"),
    "MAX_LEN": (lambda v: v >= 2, ">= 2"),
    "MICRO_BATCH": (lambda v: v >= 1, ">= 1"),
    "ACCUM_STEPS": (lambda v: v >= 1, ">= 1"),
    "EPOCHS": (lambda v: 1 <= v <= 10**6, "in [1, 1000000] (to train by steps: MAX_STEPS)"),
    "MAX_STEPS": (lambda v: v >= 0, ">= 0 (0: all epochs)"),
    "LR": (lambda v: 0 < v < 1, "between 0 and 1"),
    "WARMUP_STEPS": (lambda v: v >= 0, ">= 0"),
    "WEIGHT_DECAY": (lambda v: 0 <= v <= 1, "in [0, 1] (AdamW multiplies the weights by 1 - LR x WEIGHT_DECAY)"),
    "GRAD_CLIP": (lambda v: v >= 0, ">= 0 (0: no clipping)"),
    "LORA_R": (lambda v: v >= 1, ">= 1"),
    "LORA_ALPHA": (lambda v: v > 0, "> 0"),
    "LORA_DROPOUT": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "GRADIENT_CHECKPOINTING": (lambda v: v >= 0, ">= 0 (every Nth layer; 0: none)"),
    "MEMORY_TARGET_GIB": (lambda v: v >= 0, ">= 0 (0: off)"),
    "CE_CHUNK_TOKENS": (lambda v: v >= 0, ">= 0 (0: off)"),
    "PAD_TO_MULTIPLE": (lambda v: v >= 1, ">= 1"),
    "NUM_WORKERS": (lambda v: v >= 0, ">= 0"),
    "LOG_EVERY": (lambda v: v >= 0, ">= 0"),
    "PROFILE_STEP": (lambda v: v >= 0, ">= 0"),
    "EVAL_EVERY": (lambda v: v >= 0, ">= 0"),
    "SAVE_EVERY": (lambda v: v >= 0, ">= 0"),
    "KEEP_CHECKPOINTS": (lambda v: v >= 1, ">= 1"),
    "NAN_POLICY": (lambda v: v in ("skip", "stop"), "skip or stop"),
    "DRIFT_CHECK_EVERY": (lambda v: v >= 0, ">= 0"),
    "SEED": (lambda v: 0 <= v < 2**32, "in [0, 2**32)"),
    "DIST_TIMEOUT_S": (lambda v: 0 < v <= 7 * 86400, "> 0 and at most a week (604800)"),
    "DIST_INIT_TIMEOUT_S": (lambda v: 0 < v <= 7 * 86400, "> 0 and at most a week (604800)"),
    "ATTENTION_KERNEL": (lambda v: v in attention.KERNELS, " or ".join(attention.KERNELS)),
}


# Paths may differ between ranks (node-local copies: the data's and model's content is compared in the run
# identity; OUTPUT_DIR must still be one folder: every rank must see rank 0's lock there), and so may per-node
# resources; every other constant must be the same on every rank.
MAY_DIFFER_BY_RANK = ("MODEL_ID", "MODEL_CONFIG", "DATA_PATH", "EVAL_PATH", "OUTPUT_DIR", "RESUME", "NUM_WORKERS")


def checked_settings() -> tuple[Config, dict]:
    """The constants as this process's environment sets them (settings.read), ignored ones said, the model and
    the adapter regex checked: each a clear error before anything reads the model. A misspelled constant stops
    the run too (its value would be ignored), named beside any bad value's error."""
    typos = settings.misspelled(dict.fromkeys(f.name for f in dataclasses.fields(Config)))
    try:
        cfg, sources = settings.read(Config, ALLOWED)
    except InputError as e:
        raise InputError("; ".join([*typos, str(e)])) from None
    if typos:
        raise InputError("; ".join(typos) + " (unset it, or set the constant by its name)")
    for warning in settings.ignored(cfg):
        say(warning)
    settings.check_model_source(cfg.MODEL_ID, cfg.MODEL_CONFIG)
    settings.check_pattern("LORA_TARGETS", cfg.LORA_TARGETS)
    return cfg, sources


def plan(cfg: Config, sources: dict, world: int, device: torch.device) -> tuple[Config, dict]:
    """The planner: ATTENTION_KERNEL=auto becomes the kernel this machine runs; MEMORY_TARGET_GIB lets
    memory_budget.py choose the layout constants. Same result on every rank; shown as "planner"."""
    try:
        kernel, line = attention.choose(cfg.ATTENTION_KERNEL, device, cfg.PACKING)
    except ValueError as e:
        raise InputError(f"ATTENTION_KERNEL={cfg.ATTENTION_KERNEL}: {e}") from None
    say(line)
    cfg, sources = settings.planned(
        cfg, sources, {"ATTENTION_KERNEL": kernel} if kernel != cfg.ATTENTION_KERNEL else {}
    )
    if cfg.MEMORY_TARGET_GIB > 0:
        try:
            chosen, line = memory_budget.plan_run(cfg, world)
        except ValueError as e:
            raise InputError(f"MEMORY_TARGET_GIB={cfg.MEMORY_TARGET_GIB}: {e}") from None
        say(line)
        replaced = [f"{k}={getattr(cfg, k)}" for k, v in chosen.items() if sources[k] == "env" and getattr(cfg, k) != v]
        if replaced:
            say(
                f"warning: MEMORY_TARGET_GIB={cfg.MEMORY_TARGET_GIB} chooses the layout, over your "
                f"{' '.join(replaced)}; MEMORY_TARGET_GIB=0 runs the layout as you set it"
            )
        cfg, sources = settings.planned(cfg, sources, chosen)
    return cfg, sources


# ----------------------------------------------------------------------------------------------
# Process group
def rank_info() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment, checked (settings.launch_ranks); a plain
    `python train_ddp.py` is rank 0 of 1, on a free port (a second plain run on the machine must not collide
    with the first)."""
    if "RANK" not in os.environ:
        port = os.environ.get("MASTER_PORT")
        if not port:
            with socket.socket() as probe:  # a port the system says is free now
                probe.bind(("127.0.0.1", 0))
                port = str(probe.getsockname()[1])
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    return settings.launch_ranks(os.environ)


def rank_device(local_rank: int) -> torch.device:
    """This rank's GPU (torchrun's LOCAL_RANK), else the CPU. Asking does not create a CUDA context. More ranks
    on a node than it has GPUs stop every rank there alike (the ranks past the last GPU would fail alone, on
    CUDA's 'invalid device ordinal', and the others wait for them); so does a GPU without bf16 (before Ampere),
    whose kernels would fail or crawl mid-run."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    gpus, per_node = torch.cuda.device_count(), int(os.environ.get("LOCAL_WORLD_SIZE", 0))
    if not per_node and local_rank >= gpus:  # a launcher without LOCAL_WORLD_SIZE: this rank alone can tell
        raise InputError(f"LOCAL_RANK={local_rank}, but this node has {gpus} GPU(s): one rank per GPU")
    if per_node > gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise InputError(
            f"{per_node} ranks on this node (torchrun --nproc_per_node={per_node}), but it has {gpus} GPU(s){shown}: "
            f"one rank per GPU, --nproc_per_node={gpus}"
        )
    if (capability := torch.cuda.get_device_capability(local_rank)) < (8, 0):
        raise InputError(
            f"GPU {local_rank} is a {torch.cuda.get_device_name(local_rank)} (compute capability "
            f"{capability[0]}.{capability[1]}): training runs in bf16, which needs 8.0 or newer (A100, A10, L4, "
            f"RTX 30xx, H100 and later)"
        )
    return torch.device("cuda", local_rank)


def init_distributed(device: torch.device, output_dir: str, timeout_s: float) -> None:
    """NCCL bound to this rank's GPU, gloo on CPU. The flight recorder keeps each rank's last collectives
    (read by guards.HangWatchdog, dumped to OUTPUT_DIR when a collective times out). Forming the group waits
    for every rank: the wait is said, and a group that does not form is one line, not the store's traceback."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(Path(output_dir).resolve() / "flight_recorder_rank_"))
    where, world = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", int(os.environ["WORLD_SIZE"])
    if world > 1:
        say(f"forming the process group of {world} ranks at {where} (waits up to DIST_INIT_TIMEOUT_S={timeout_s})")
    try:
        if device.type == "cuda":
            dist.init_process_group("nccl", timeout=backend_timeout(timeout_s), device_id=device)
        else:
            dist.init_process_group("gloo", timeout=backend_timeout(timeout_s))
    except dist.DistError as e:  # the store: a rank that never came, an address in use or unreachable
        raise guards.GroupNotFormed(
            f"the process group of {world} ranks at {where} did not form: {str(e).splitlines()[0]} (a rank may have "
            f"stopped before joining: read every node's log for its error; else, every rank started with the same "
            f"MASTER_ADDR, MASTER_PORT and WORLD_SIZE? a port no other job holds?)"
        ) from None
    except RuntimeError as e:
        if "connectFullMesh" not in str(e):
            raise
        again = " (a torchrun restart: on gloo it often fails so; running the command again resumes)"
        raise guards.GroupNotFormed(  # seen after torchrun --max-restarts restarted a group on gloo, in plain torch too
            f"the process group of {world} ranks at {where} did not form: gloo could not connect the ranks "
            f"({str(e).splitlines()[0][:160]}){again if int(os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)) else ''}"
        ) from None


NCCL_BACKSTOP_S = 60


def backend_timeout(seconds: float) -> timedelta:
    """gloo raises in Python at its timeout. NCCL's timeout can only abort the process (SIGABRT, C++ frames),
    so HangWatchdog reports first and NCCL's own timeout stays a backstop, NCCL_BACKSTOP_S later."""
    return timedelta(seconds=seconds + (NCCL_BACKSTOP_S if torch.cuda.is_available() else 0))


def set_collective_timeout(seconds: float, watchdog: guards.HangWatchdog) -> None:
    dist.distributed_c10d._set_pg_timeout(backend_timeout(seconds))  # what torchtitan does after its first step
    watchdog.timeout_s = seconds


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """One small all-reduce for a handful of scalars (float64, so token counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


# ----------------------------------------------------------------------------------------------
# Model: Gemma 4 + regex-scoped LoRA, wrapped with its loss so DDP sees one forward
def load_model(cfg: Config, device: torch.device):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    if not is_rank0():
        hf_logging.disable_progress_bar()  # the weight-loading bar once, on rank 0

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    implementation = attention.register(attention.choose(cfg.ATTENTION_KERNEL, device)[0])  # as plan() chose
    if cfg.MODEL_CONFIG:  # random weights, same on every rank (same seed); DDP broadcasts rank 0's anyway
        torch.manual_seed(cfg.SEED)
        with device:
            model = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(cfg.MODEL_CONFIG), dtype=dtype, attn_implementation=implementation
            )
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(
                cfg.MODEL_ID, dtype=dtype, device_map={"": device}, attn_implementation=implementation
            )
        except (OSError, ValueError, SafetensorError) as e:  # a file missing, truncated or unreadable
            why = next(iter(str(e).strip().splitlines()), type(e).__name__)
            raise InputError(f"MODEL_ID {cfg.MODEL_ID!r}: cannot load the model: {why}") from e
    # text rows never run the vision and audio embedders: their weights leave the GPU (the budget's rule)
    for name in [n for n, _ in model.model.named_children() if memory_budget.is_left_out(n)]:
        setattr(model.model, name, None)
    model.config.use_cache = False
    if cfg.MAX_LEN > (context := model.config.get_text_config().max_position_embeddings):
        say(f"warning: MAX_LEN={cfg.MAX_LEN} is longer than the model's context ({context} tokens)")
    return model


def add_lora(model, cfg: Config):
    """Freeze the base model and add LoRA adapters on the modules LORA_TARGETS full-matches."""
    from peft import LoraConfig, get_peft_model

    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if not any(re.fullmatch(cfg.LORA_TARGETS, n) for n in linear):
        raise InputError(f"LORA_TARGETS {cfg.LORA_TARGETS!r} matches no Linear module (names look like {linear[:3]})")
    matched = [n or "(the whole model)" for n, _ in model.named_modules() if re.fullmatch(cfg.LORA_TARGETS, n)]
    if not_linear := [n for n in matched if n not in linear]:  # PEFT would refuse them, printing the whole model
        raise InputError(
            f"LORA_TARGETS {cfg.LORA_TARGETS!r} also matches {len(not_linear)} modules that are not Linear layers "
            f"({', '.join(not_linear[:3])}, ...): LoRA goes on Linear layers, e.g. {Config.LORA_TARGETS!r}"
        )
    lora = LoraConfig(
        r=cfg.LORA_R,
        lora_alpha=cfg.LORA_ALPHA,
        lora_dropout=cfg.LORA_DROPOUT,
        target_modules=cfg.LORA_TARGETS,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora)  # adapters are FP32 even on a BF16 base (PEFT's default)
    if cfg.LORA_BF16_INPUTS:  # PEFT casts each input to the FP32 adapter dtype, then autocast casts it back
        for module in peft_model.modules():
            if hasattr(module, "cast_input_dtype_enabled"):
                module.cast_input_dtype_enabled = False
    compile_and_checkpoint(peft_model.get_base_model().get_decoder().layers, cfg)  # after PEFT: adapters included
    return peft_model


def compile_and_checkpoint(layers, cfg: Config) -> None:
    """COMPILE_LAYERS: each decoder layer compiled on its own (fuses norms, rotary, gelu). GRADIENT_CHECKPOINTING:
    every Nth layer checkpointed around its compiled forward (checkpointed), so its recompute must trace what
    the forward traced. Hence, for checkpointed layers: the layers that write or read shared_kv_states (the last
    of each type writes, even without KV sharing) stay eager, as the dict differs between forward and recompute
    and each difference is a recompile (past torch's 8 per code object, layers run eagerly); and dynamo's DDP
    graph splitting is off, as it splits only what compiles inside DDP's forward."""
    if cfg.COMPILE_LAYERS and cfg.GRADIENT_CHECKPOINTING:
        torch._dynamo.config.optimize_ddp = False
    for i, layer in enumerate(layers):
        checkpointed_layer = cfg.GRADIENT_CHECKPOINTING and i % cfg.GRADIENT_CHECKPOINTING == 0
        shares_kv = layer.self_attn.store_full_length_kv or layer.self_attn.is_kv_shared_layer
        compiled = cfg.COMPILE_LAYERS and not (checkpointed_layer and shares_kv)
        forward = torch.compile(layer.forward) if compiled else layer.forward
        layer.forward = (
            functools.partial(checkpointed, forward, cfg.CHECKPOINT_OFFLOAD) if checkpointed_layer else forward
        )


def checkpointed(forward, offload: bool, *args, **kwargs):
    """A decoder layer under non-reentrant checkpointing (works with DDP, no_sync and frozen inputs): backward
    runs its forward again. Around the compiled layer, not inside it, so the recompute is compiled code too
    and the offload of its input to host memory (which torch.compile cannot trace) stays outside."""
    with torch.autograd.graph.saved_tensors_hooks(to_host, from_host) if offload else nullcontext():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def to_host(tensor: torch.Tensor) -> tuple:
    """CHECKPOINT_OFFLOAD: what checkpointing keeps of a layer (its input) goes to pinned host memory."""
    return tensor.device, pinned_copy(tensor.detach()), tensor.requires_grad


def from_host(saved: tuple) -> torch.Tensor:
    """Back for the recompute, with its requires_grad: an input that lost it would make the compiled layer
    trace (and save for backward) another graph than in the forward pass (torch's save_on_cpu loses it)."""
    device, host, requires_grad = saved
    return host.to(device, non_blocking=True).requires_grad_(requires_grad)


def optimizer_state_on_host(optimizer: torch.optim.Optimizer) -> None:
    """OPTIMIZER_OFFLOAD: AdamW's state (8 bytes per adapter parameter) waits in pinned host memory while the
    forward and backward need the GPU, and comes over for each step only (each state tensor copied over and
    back). Called after a resume's load_state_dict, which puts the state on the GPU."""

    def move(to_gpu: bool) -> None:
        for param, state in optimizer.state.items():
            for key, value in state.items():
                state[key] = value.to(param.device, non_blocking=True) if to_gpu else pinned_copy(value)
        if not to_gpu and torch.cuda.is_available():
            torch.cuda.synchronize()  # the host copies are whole before anything reads them (a checkpoint)

    move(to_gpu=False)
    optimizer.register_step_pre_hook(lambda *_: move(to_gpu=True))
    optimizer.register_step_post_hook(lambda *_: move(to_gpu=False))


def pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in host memory, pinned on a GPU machine so that copies both ways run asynchronously."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=torch.cuda.is_available())
    return host.copy_(tensor, non_blocking=True)


def wrap_ddp(loss_module: CausalLMLoss, device: torch.device) -> DDP:
    """DDP around the model and its loss. broadcast_buffers=False: Gemma's buffers (embedding scale, rotary
    tables) are constants, identical on every rank; re-broadcasting them every step would be a collective for
    nothing."""
    return DDP(
        loss_module,
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        broadcast_buffers=False,
    )


def settle_buckets(model: DDP, batch: dict, device: torch.device) -> None:
    """One throwaway forward and backward, gradients dropped: DDP re-buckets after its first backward, and above
    2 ranks a float sum's last bits follow the bucket layout. So every run, fresh or resumed, reduces every
    step in the same buckets, and resume stays bitwise at any world size."""
    with autocast(device):
        loss_sum, _ = model(**on_device(batch, device))
    loss_sum.backward()  # an all-reduce, on every rank
    model.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------------------------
# Data: each rank its own shard of every epoch (DistributedSampler), the same number of steps on every rank
def read_conversations(cfg: Config) -> tuple:
    """(the tokenizer, DATA_PATH's conversations, EVAL_PATH's or []), each row checked (chat_data)."""
    tokenizer = chat_tokenizer(cfg.MODEL_ID)  # first: the data must not spell its control tokens
    special = control_tokens(tokenizer)
    conversations = load_conversations(cfg.DATA_PATH, special, cfg.MODEL_ID)
    return tokenizer, conversations, load_conversations(cfg.EVAL_PATH, special, cfg.MODEL_ID) if cfg.EVAL_PATH else []


def epoch_data(dataset: ChatDataset, cfg: Config, epoch: int) -> Dataset:
    """What `epoch` iterates: the conversations, or with PACKING their packed rows (the same on every rank)."""
    if not cfg.PACKING:
        return dataset
    return PackedRows(dataset, rows_of_epoch(dataset.token_lengths, cfg.SEED, epoch, cfg.MAX_LEN))


class PerEpoch(dict):
    """{epoch: make(epoch)}, each made when first read: a run reads only the epochs it reaches (EPOCHS=1000
    MAX_STEPS=50 packed 1,000 epochs up front, minutes of silence on every start)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, epoch: int):
        self[epoch] = value = self.make(epoch)
        return value


def train_loader(dataset, cfg: Config, rank: int, world: int, epoch: int, skip: int, collate) -> DataLoader:
    """This rank's micro-batches of `epoch` (epoch_data), without the first `skip` samples or rows."""
    # drop_last twice: the sampler gives every rank the same number of samples, the loader the
    # same number of full micro-batches, so every rank runs the same number of steps (no hang).
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=cfg.SEED, drop_last=True)
    sampler.set_epoch(epoch)
    lengths = dataset.lengths if cfg.GROUP_BY_LENGTH and not cfg.PACKING else None  # rows are of one length
    return guards.RankDataLoader(  # a DataLoader whose workers live and die with this rank
        dataset,
        batch_size=cfg.MICRO_BATCH,
        sampler=StepOrder(sampler, skip, lengths, window=cfg.MICRO_BATCH * cfg.ACCUM_STEPS),
        drop_last=True,
        collate_fn=collate,
        num_workers=cfg.NUM_WORKERS,
        timeout=cfg.DIST_TIMEOUT_S if cfg.NUM_WORKERS else 0,  # a worker stuck in the data: an error, not a hang
        persistent_workers=False,
        pin_memory=torch.cuda.is_available(),
    )


def steps_per_epoch(n_samples: int, world: int, cfg: Config) -> int:
    """Optimizer steps per epoch, identical on every rank; a partial accumulation window is dropped."""
    per_step = world * cfg.MICRO_BATCH * cfg.ACCUM_STEPS
    if n_samples // per_step == 0:
        what = (
            f"packed into {n_samples} rows of MAX_LEN={cfg.MAX_LEN} tokens" if cfg.PACKING else f"{n_samples} samples"
        )
        fits = n_samples // (world * cfg.MICRO_BATCH)  # the ACCUM_STEPS that the samples fill a step of
        ways = (
            [f"ACCUM_STEPS={fits}"]
            if fits
            else [f"MICRO_BATCH={n_samples // world} ACCUM_STEPS=1"] * (n_samples >= world)
        )
        ways += ["fewer ranks"] * (world > 1) + ["a smaller MAX_LEN (more packed rows)"] * cfg.PACKING
        raise InputError(
            f"{cfg.DATA_PATH}: {what}, but one optimizer step needs "
            f"world_size*MICRO_BATCH*ACCUM_STEPS = {world}*{cfg.MICRO_BATCH}*{cfg.ACCUM_STEPS} = {per_step}; "
            f"{'it fits with ' + ', '.join(ways) + ' or' if ways else 'it needs'} more data"
        )
    return (n_samples // world // cfg.MICRO_BATCH) // cfg.ACCUM_STEPS


def on_device(batch: dict, device: torch.device) -> dict:
    """The batch on `device`, with right_padded checked on the CPU copy (no GPU sync): only then may the
    global layers drop the dense mask for a causal kernel (attention.py). Never for packed rows."""
    mask = batch["attention_mask"]
    right_padded = "position_ids" not in batch and bool((mask[:, 1:] <= mask[:, :-1]).all())
    return {**{k: v.to(device, non_blocking=True) for k, v in batch.items()}, "right_padded": right_padded}


def autocast(device: torch.device):
    """bf16 autocast on GPU (adapters stay FP32, no GradScaler needed); plain FP32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


# ----------------------------------------------------------------------------------------------
# One optimizer step: no_sync accumulation with a token-weighted global loss
def forward_backward(model: DDP, micro_batches: list[dict], device: torch.device, stop=None) -> tuple:
    """Forward+backward over one accumulation window. Returns the loss sum, (targets, non-pad tokens, padded
    tokens), each summed over all ranks, and whether any rank was asked to stop (`stop`, a GracefulStop).

    N, the number of targets in the whole update over all ranks, is known before any backward via one
    tiny all-reduce. Backpropagating world*S/N per micro-batch (S: local loss sum) gives, after DDP
    averages over the world, exactly the gradient of the global token-mean loss.
    """
    local_targets = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in micro_batches)
    local_tokens = sum(int(b["attention_mask"].sum()) for b in micro_batches)
    local_padded = sum(b["attention_mask"].numel() for b in micro_batches)
    n_targets, n_tokens, n_padded = all_reduce_sum([local_targets, local_tokens, local_padded], device)
    scale = dist.get_world_size() / max(n_targets, 1.0)
    local_loss = torch.zeros((), dtype=torch.float64, device=device)
    for i, batch in enumerate(micro_batches):
        batch = on_device(batch, device)
        # Micro-batches 1..A-1: forward AND backward inside no_sync (no communication); the last one
        # runs outside, so DDP does one bucketed all-reduce, overlapped with its backward.
        sync_context = nullcontext() if i == len(micro_batches) - 1 else model.no_sync()
        with sync_context:
            with autocast(device):
                loss_sum, _ = model(**batch)
            (loss_sum * scale).backward()
        local_loss += loss_sum.detach().double()
    loss_sum_all, stops = all_reduce_sum([local_loss.item(), guards.stop_asked(stop)], device)
    return loss_sum_all, (n_targets, n_tokens, n_padded), stops > 0


def optimizer_step(optimizer, scheduler, params: list, cfg: Config, loss_sum: float, n_targets: int, step: int):
    """Clip, step, schedule. Returns (grad norm, why the update was skipped or None, the lr it used). After the
    all-reduces every rank holds the same averaged gradients and counts: the same norm, the same decision.
    A step without a single target token on any rank (rows whose assistant turns MAX_LEN cut off) applies no
    update: its gradient is zero, but AdamW's momentum would still move the weights."""
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.GRAD_CLIP or math.inf))
    finite = math.isfinite(loss_sum) and math.isfinite(grad_norm)
    if not finite and cfg.NAN_POLICY == "stop":
        raise guards.JobStopped(
            f"non-finite loss or gradient norm at step {step} (loss sum {loss_sum}, grad norm {grad_norm}); "
            f"NAN_POLICY=stop"
        )
    skipped = None if finite else "non-finite loss or gradient; NAN_POLICY=skip"
    if finite and n_targets == 0:
        skipped = "no target token"
    if skipped is None:
        optimizer.step()
    lr = scheduler.get_last_lr()[0]
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, skipped, lr


def lr_schedule(optimizer, cfg: Config, total_steps: int, steps_taken: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over WARMUP_STEPS in which step 1 already trains (at LR/WARMUP_STEPS), then cosine decay,
    positioned after `steps_taken` steps: a resumed run derives it from its own LR, WARMUP_STEPS and length."""
    warmup = cfg.WARMUP_STEPS
    if warmup > total_steps:
        say(f"warning: WARMUP_STEPS={warmup} > the run's {total_steps} steps: the LR never reaches LR={cfg.LR}")

    def factor(steps_taken: int) -> float:
        if steps_taken < warmup:
            return (steps_taken + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (steps_taken - warmup) / max(1, total_steps - warmup)))

    for group in optimizer.param_groups:
        group["initial_lr"] = cfg.LR
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch=steps_taken - 1)


def synchronized_clock(device: torch.device) -> float:
    """time.perf_counter() once the GPU has finished what was queued (step times measure the work)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


@torch.no_grad()
def evaluate(
    model: DDP, dataset: Dataset, collate: PadCollate, device: torch.device, micro_batch: int, stop=None
) -> dict | None:
    """Token-weighted eval loss over the whole file: equals a single-process evaluation. None if a rank was
    asked to stop (`stop`, a GracefulStop): the ranks agree after every batch, so a preemption during a long
    evaluation still reaches its checkpoint within torchrun's 30 s.

    Indices rank, rank+world, ... (no DistributedSampler padding, which would count examples twice), in the
    same number of batches on every rank (a shorter shard ends with an empty one); model.module, never the DDP
    forward (which would expect a backward and a matching collective).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = range(rank, len(dataset), world)
    was_training = model.training
    model.eval()
    loss, targets = 0.0, 0
    try:
        for at in range(0, math.ceil(len(dataset) / world), micro_batch):
            if rows := shard[at : at + micro_batch]:
                with autocast(device):
                    s, n = model.module(**on_device(collate([dataset[i] for i in rows]), device))
                loss, targets = loss + float(s), targets + int(n)
            if all_reduce_sum([guards.stop_asked(stop)], device)[0]:
                return None
    finally:
        model.train(was_training)
    loss, targets = all_reduce_sum([loss, targets], device)
    if not targets:  # every answer cut by MAX_LEN: no loss to report (0 would read as a perfect model)
        return {"eval_loss": None, "eval_ppl": None, "eval_targets": 0}
    return {"eval_loss": loss / targets, "eval_ppl": math.exp(min(loss / targets, 50.0)), "eval_targets": int(targets)}


def evaluate_if_due(
    model: DDP, eval_set, collate, device, micro_batch: int, stop, progress: dict, log, stopping: bool
) -> bool:
    """The evaluation progress["eval_due"] asks for, unless the job is stopping (returns whether it is). One that a
    stop skips stays due: it is saved with the checkpoint and runs first when the run resumes (if EVAL_PATH is
    still set: a resume may drop it, and nothing is due then)."""
    if eval_set is None and progress.pop("eval_due", None):
        say(f"the evaluation due at step {progress['step']} is not run: EVAL_PATH is not set any more")
    if not progress.get("eval_due"):
        return stopping
    step = progress["step"]
    what = "final evaluation" if step == log.total_steps else f"evaluation at step {step}"
    if stopping or (metrics := evaluate(model, eval_set, collate, device, micro_batch, stop)) is None:
        say(f"{what} skipped: stopped by {stop.by}")
        return True
    log.eval(step, metrics, final=step == log.total_steps)
    progress["eval_due"] = False
    return False


# ----------------------------------------------------------------------------------------------
# Checkpoints: rank 0 writes (atomically, run_record.publish_atomically), every rank waits at a barrier
def adapter_bytes(model: DDP) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def save_checkpoint(model: DDP, optimizer, progress: dict, run_config: dict, output_dir: str, keep: int) -> Path:
    """Adapter + optimizer state and progress, as output_dir/checkpoints/step-N; all but the `keep` newest
    pruned. (No scheduler state: the schedule is a function of the settings and the step, re-derived.)"""
    final = Path(os.path.abspath(output_dir)) / "checkpoints" / f"step-{progress['step']:08d}"  # as one finds it
    if dist.get_rank() == 0:

        def write(folder: Path) -> None:
            model.module.lm.save_pretrained(folder)  # model.module unwraps DDP
            torch.save({"optimizer": optimizer.state_dict(), "progress": progress}, folder / "trainer_state.pt")
            run_record.write_run_json(folder, run_config, progress)

        final.parent.mkdir(exist_ok=True)  # not parents: an OUTPUT_DIR that vanished is an error, not made anew
        run_record.publish_atomically(final, write, expected_bytes=3 * adapter_bytes(model))  # + AdamW's moments
        # prune only older checkpoints (later ones, of another line of training, were set aside at the start)
        older = [p for p in run_record.checkpoints_in(final.parent) if p.name < final.name]
        for stale in older[: max(len(older) - keep + 1, 0)]:
            if said := run_record.prune(stale):
                say(said)
    dist.barrier()  # nobody reads (or moves on) before the checkpoint is complete
    return final


def save_adapter(model: DDP, run_config: dict, progress: dict, output_dir: str) -> Path:
    """The final adapter as output_dir/adapter, loadable with PeftModel.from_pretrained, with the run's record
    (run.json: settings, identity, progress): what a rerun reads to know the run is complete."""
    final = Path(os.path.abspath(output_dir)) / "adapter"
    if dist.get_rank() == 0:

        def write(folder: Path) -> None:
            model.module.lm.save_pretrained(folder)
            run_record.write_run_json(folder, run_config, progress)

        run_record.publish_atomically(final, write, expected_bytes=adapter_bytes(model))
    dist.barrier()
    return final


def check_same_checkpoint(path: Path | None) -> Path | None:
    """Every rank picked its checkpoint from its own view of OUTPUT_DIR. If the views differ (node-local
    folders, stale caches of shared storage), ranks would resume from different steps and desynchronise:
    stop all of them with the same error instead."""
    chosen = [None] * dist.get_world_size()
    dist.all_gather_object(chosen, path and path.name)  # (its folder is OUTPUT_DIR, from each node's working dir)
    if len(set(chosen)) > 1:
        raise guards.JobStopped(
            f"ranks disagree on the checkpoint to resume from (by rank: {chosen}); "
            f"OUTPUT_DIR must be one shared folder, seen the same by every node"
        )
    return path


def load_checkpoint(path: Path, peft_model, optimizer) -> dict:
    """The adapter weights and AdamW's moments from `path`; every hyperparameter stays as this run sets it
    (an LR or WEIGHT_DECAY changed under RESUME_ALLOW_CHANGES=1 takes effect). Returns the progress."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    trainer_state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
    state = load_file(str(path / "adapter_model.safetensors"), device=str(next(peft_model.parameters()).device))
    set_peft_model_state_dict(peft_model, state)
    settings_now = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(trainer_state["optimizer"])  # also puts the checkpoint's lr, weight_decay back...
    for group, mine in zip(optimizer.param_groups, settings_now, strict=True):
        group.update(mine)  # ... which this run's own replace
    return trainer_state["progress"]


def already_complete(
    finished: str | None, cfg: Config, total_steps: int, epoch_steps: PerEpoch, device: torch.device
) -> bool:
    """Whether this run has nothing left to do (run_record.finished), decided from every rank's view of
    OUTPUT_DIR at once (a rank that returned alone would leave its peers waiting in DDP's first broadcast)."""
    adapter = Path(cfg.OUTPUT_DIR) / "adapter"
    (votes,) = all_reduce_sum([float(finished is not None)], device)
    if 0 < votes < dist.get_world_size():
        raise guards.JobStopped(
            f"ranks disagree whether {adapter} is complete ({votes:.0f} of {dist.get_world_size()} "
            f"see it intact): OUTPUT_DIR must be one shared folder, seen the same by every node"
        )
    if votes:
        say(
            f"this run is already complete ({total_steps} of {total_steps} steps): nothing to train{finished}. To "
            f"train again, RESUME='' or another OUTPUT_DIR; "
            f"{run_record.how_to_train_longer(cfg, total_steps, epoch_steps)}"
        )
        say(where_everything_is(cfg.OUTPUT_DIR, adapter, cfg.MODEL_ID, cfg.MODEL_CONFIG))
    return bool(votes)


# ----------------------------------------------------------------------------------------------
def main() -> None:
    settings.check_arguments(sys.argv[1:], Config, __doc__)  # settings are environment variables, never arguments
    if "RANK" not in os.environ:
        say("not started by torchrun: training as one process. For N GPUs: torchrun --nproc_per_node=N train_ddp.py")
    rank, local_rank, world = rank_info()
    stop = guards.GracefulStop()
    # Until the process group forms, a rank that fails tells the ranks waiting for it (they end too).
    with guards.FailuresBeforeGroup(rank, world, stop):
        device = rank_device(local_rank)
        # 1. Checks. Everything that can be wrong with the inputs fails here, identically on every rank and
        #    before the first collective: bad input can never turn into a hang.
        asked, asked_sources = checked_settings()  # as the user set them; the planner may replace some
        settings.check_writable(asked.OUTPUT_DIR)
        lock = run_record.OutputLock(asked.OUTPUT_DIR) if rank == 0 else None  # one job per OUTPUT_DIR
        stop.install(rank, lock)  # a stop signal ends the rank at once until it can checkpoint (stop.arm below)
        if lock:  # taken once `stop` holds it: every exit from here on releases it
            lock.acquire()
        cfg, sources = plan(asked, asked_sources, world, device)
        tokenizer, conversations, eval_conversations = read_conversations(cfg)
        if not cfg.PACKING:  # data too few for one step (packed: once rows are known)
            steps_per_epoch(len(conversations), world, cfg)
        identity = run_record.identity(cfg, world, tokenizer_sha256=tokenizer_sha256(tokenizer))
        kept = lengths_file(cfg.OUTPUT_DIR, identity["data_sha256"], tokenizer, cfg.MAX_LEN) if cfg.PACKING else None
        # Every rank counts the lengths; each node's first rank keeps them (so rank 0 alone sees whether it counts).
        dataset = ChatDataset(conversations, tokenizer, cfg.MAX_LEN, cfg.ASSISTANT_ONLY_LOSS, kept, local_rank == 0)
        eval_set = (
            ChatDataset(eval_conversations, tokenizer, cfg.MAX_LEN, cfg.ASSISTANT_ONLY_LOSS)
            if eval_conversations
            else None
        )
        if kept is not None and not kept.exists():  # about 75 s per 100k rows on 2 cores: not a silent wait
            say(f"packing: counting the token lengths of {len(conversations):,} rows, once (kept in {kept})")
        epochs = PerEpoch(lambda e: epoch_data(dataset, cfg, e))  # with PACKING: each epoch packed once, if reached
        epoch_steps = PerEpoch(lambda e: steps_per_epoch(len(epochs[e]), world, cfg))
        used = (
            epoch_steps[0] * world * cfg.MICRO_BATCH * cfg.ACCUM_STEPS
        )  # samples (rows) per epoch; drop_last: the rest
        say(data_summary(dataset, epochs[0], used, cfg.DATA_PATH))
        for warning in (
            fields_left_out(tokenizer, conversations, cfg.DATA_PATH),
            inline_reasoning(conversations, cfg.DATA_PATH),
            held_out_copies(conversations, eval_conversations, cfg.EVAL_PATH),
            eval_rows_cut(eval_set, cfg.EVAL_PATH),
        ):
            if warning:
                say(warning)
        finished = run_record.finished(cfg, identity, epoch_steps)
        resume = None if finished is not None else run_record.checkpoint_to_resume(cfg, identity, epoch_steps)
        continued = Path(cfg.OUTPUT_DIR) / "adapter" if finished is not None else resume  # None: a fresh start
        total_steps = run_record.last_step(cfg, epoch_steps, continued and run_record.progress_of(continued))
        run_config = {
            "settings": settings.record(cfg, sources, asked, asked_sources),
            "versions": run_record.versions(device),
            "identity": identity,
            "world_size": world,
            "resumed_from": resume and str(resume),
            "eval_sha256": cfg.EVAL_PATH and run_record.sha256_file(Path(cfg.EVAL_PATH)),  # a node-local copy: same?
        }
        if rank == 0:  # the run's effective settings, printed once (saved with the run below, and in every checkpoint)
            say(settings.show(run_config["settings"]))

        # 2. Model, adapters and gradient checkpointing, all BEFORE the DDP wrap. Same seed on every
        #    rank while adapters are created; seed + rank afterwards (dropout masks differ per rank).
        if device.type == "cuda":
            torch.cuda.set_device(device)  # before anything creates a CUDA context: none stray on GPU 0
        torch.manual_seed(cfg.SEED)
        peft_model = add_lora(load_model(cfg, device), cfg)
        torch.manual_seed(cfg.SEED + rank)
        # the base weights join the run's identity once loaded (a hub model's files are only now in its cache)
        identity["model_weights_sha256"] = None if cfg.MODEL_CONFIG else run_record.weights_sha256(cfg.MODEL_ID)
        if resume is not None:
            run_record.check_same_weights(resume, identity)
        if rank == 0 and finished is None:  # a complete run's config.json stays the one it was trained with
            run_record.save_run_config(cfg.OUTPUT_DIR, run_config)

        # 3. Process group: NCCL on GPUs, gloo on CPU. From here on every failure is reported and bounded.
        init_distributed(device, cfg.OUTPUT_DIR, cfg.DIST_INIT_TIMEOUT_S)
    watchdog = guards.HangWatchdog(rank, world, cfg.DIST_INIT_TIMEOUT_S, stop)
    with guards.failures_reported(watchdog, lock, cfg.OUTPUT_DIR, cfg.MEMORY_TARGET_GIB):
        if cfg.SAVE_ON_SIGTERM:
            stop.arm(watchdog)  # from here on a preemption saves first (torchrun waits 30 s before SIGKILL)
        # The first collective compares what every rank read: one rank with another environment, another copy of
        # the data or model, or another OUTPUT_DIR than rank 0's (rank 0's lock, taken before the group formed,
        # is not there) stops them all.
        compared = {k: v for k, v in identity.items() if k != "by_path"}  # (it names MODEL_ID's path)
        guards.check_same_settings(
            run_config["settings"],
            {**compared, "eval_sha256": run_config["eval_sha256"]},
            MAY_DIFFER_BY_RANK,
            run_record.lock_holder(cfg.OUTPUT_DIR),
        )
        # 4. Optimizer, schedule and resume: every rank loads the same checkpoint, so all start identical.
        if already_complete(finished, cfg, total_steps, epoch_steps, device):
            return
        params = [p for p in peft_model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.LR, weight_decay=cfg.WEIGHT_DECAY, fused=device.type == "cuda")
        progress = {"epoch": 0, "step": 0, "step_in_epoch": 0, "updates": 0}  # updates: steps that were not skipped
        if (resume := check_same_checkpoint(resume)) is not None:
            progress = load_checkpoint(resume, peft_model, optimizer)
            say(f"resumed from {resume} at step {progress['step']}")
            if changed := run_record.eval_data_changed(resume, run_config["eval_sha256"], cfg.EVAL_PATH):
                say(changed)
        if rank == 0 and (moved := run_record.set_aside_later_saves(cfg.OUTPUT_DIR, progress["step"], resume)):
            say(moved)
        if cfg.OPTIMIZER_OFFLOAD:
            optimizer_state_on_host(optimizer)
        scheduler = lr_schedule(optimizer, cfg, total_steps, steps_taken=progress["step"])
        position = watchdog.position  # where the loop is, for every report
        position.current = position.completed = progress["step"]
        first_step, stopping = progress["step"] + 1, False

        # 5. DDP around the model and its loss: one forward, gradients all-reduced in buckets during backward.
        model = wrap_ddp(CausalLMLoss(peft_model, cfg.CE_CHUNK_TOKENS, compiled=cfg.COMPILE_LAYERS), device)
        collate = PadCollate(tokenizer.pad_token_id, cfg.PAD_TO_MULTIPLE, cfg.MAX_LEN)  # eval: a conversation a row
        train_collate = PackCollate(tokenizer.pad_token_id, cfg.MAX_LEN) if cfg.PACKING else collate
        n_trainable, n_total = peft_model.get_nb_trainable_parameters()
        say(
            f"world {world} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'} | "
            f"{n_total:,} params, {n_trainable:,} trainable "
            f"({100 * n_trainable / n_total:.2f}%) | global batch {cfg.MICRO_BATCH}x{cfg.ACCUM_STEPS}x{world}="
            f"{cfg.MICRO_BATCH * cfg.ACCUM_STEPS * world} | {total_steps} steps"
        )
        predict = functools.partial(memory_budget.predicted_peak_gib, cfg, peft_model.get_base_model(), world)
        slots = world * cfg.MICRO_BATCH * cfg.ACCUM_STEPS * cfg.MAX_LEN if cfg.PACKING else 0  # "fill" in metrics
        log = StepLog(cfg.OUTPUT_DIR, cfg.LOG_EVERY, total_steps, progress["step"], device, predict, slots)
        trace = Path(cfg.OUTPUT_DIR) / f"trace_step{cfg.PROFILE_STEP}_rank{rank}.json"
        model.train()
        # a full micro-batch (packed: step 1's very shape)
        settle_buckets(model, train_collate([epochs[0][i] for i in range(cfg.MICRO_BATCH)]), device)
        # the evaluation progress["eval_due"] asks for, bound to this run: evaluate_due(stopping) -> stopping
        evaluate_due = functools.partial(
            evaluate_if_due, model, eval_set, collate, device, cfg.MICRO_BATCH, stop, progress, log
        )
        if evaluate_due(stopping):  # one a stop skipped: before anything else
            before = f"step {first_step}" if first_step <= total_steps else "the adapter is saved"
            say(f"stopped by {stop.by} before {before}: {resume} still holds this state and resumes")
            return

        # 6. The loop. Each rank reads its own shard (DistributedSampler); an epoch is the same number of
        #    optimizer steps on every rank, so every collective below is entered by every rank.
        while progress["step"] < total_steps:
            epoch = progress["epoch"]
            skip = progress["step_in_epoch"] * cfg.ACCUM_STEPS * cfg.MICRO_BATCH  # samples already trained on
            batches = iter(train_loader(epochs[epoch], cfg, rank, world, epoch, skip, train_collate))
            while progress["epoch"] == epoch and progress["step"] < total_steps:
                step = position.current = progress["step"] + 1
                torch.manual_seed(cfg.SEED + 1_000_003 * rank + step)  # dropout masks: a function of (seed, rank, step)
                t_data = time.perf_counter()
                micro_batches = [next(batches) for _ in range(cfg.ACCUM_STEPS)]
                t0 = synchronized_clock(device)
                with profiled(step == cfg.PROFILE_STEP, device, trace):
                    # no_sync for all but the last micro-batch; the token count is all-reduced first
                    loss_sum, counts, stopping = forward_backward(model, micro_batches, device, stop)
                grad_norm, skipped, lr = optimizer_step(optimizer, scheduler, params, cfg, loss_sum, counts[0], step)
                step_time = synchronized_clock(device) - t0
                updates = progress.get("updates", 1) + (skipped is None)  # (1: a checkpoint from before the count)
                progress.update(step=step, step_in_epoch=progress["step_in_epoch"] + 1, updates=updates)
                if progress["step_in_epoch"] == epoch_steps[epoch]:  # epoch end: resume starts the next epoch
                    progress.update(epoch=epoch + 1, step_in_epoch=0)
                position.completed = step
                if step == first_step:  # the ranks are in lockstep now: hangs get the short timeout
                    set_collective_timeout(cfg.DIST_TIMEOUT_S, watchdog)
                log.step(step, epoch, loss_sum, counts, grad_norm, lr, skipped, step_time, t0 - t_data, micro_batches)
                if cfg.DRIFT_CHECK_EVERY and step % cfg.DRIFT_CHECK_EVERY == 0:
                    guards.check_replicas_identical(model.module, step)  # all-gather of every rank's adapter checksum
                if eval_set is not None and (cfg.EVAL_EVERY and step % cfg.EVAL_EVERY == 0 or step == total_steps):
                    progress["eval_due"] = True  # in every checkpoint until it has run: a stop only postpones it
                stopping = evaluate_due(stopping)  # preempted before or during it: checkpoint as below
                # every rank learnt it in the same all-reduce; a final evaluation it skipped is left to the rerun,
                # which resumes from this checkpoint, evaluates, then saves the adapter
                preempted = stopping and (step < total_steps or progress.get("eval_due"))
                periodic = cfg.SAVE_EVERY and step % cfg.SAVE_EVERY == 0 and step < total_steps
                if preempted or periodic or progress["epoch"] > epoch:
                    if preempted:
                        stop.at_boundary.set()  # the save is not cut short by the 25 s timer
                    t_save = time.perf_counter()
                    path = save_checkpoint(
                        model, optimizer, dict(progress), run_config, cfg.OUTPUT_DIR, cfg.KEEP_CHECKPOINTS
                    )
                    seconds = log.saved(step, "checkpoint", since=t_save)
                    if preempted:
                        again = "the same command" if cfg.RESUME == "auto" else f"RESUME=auto (or RESUME={path})"
                        say(f"stopped by {stop.by} after step {step}: {path} saved; {again} resumes")
                        return
                    say(f"checkpoint step {step} saved in {seconds:.2f}s")
        log.close()
        if progress["updates"] == 0:  # the same on every rank: the decisions were all-reduced (and checkpointed)
            why = "; ".join(dict.fromkeys(log.skipped.values())) or "in earlier attempts"
            raise guards.JobStopped(
                f"all {progress['step']} steps of this run skipped their update ({why}): the adapter did not change, "
                f"so it is not saved as the run's result"
            )

        # 7. Drift check and the adapter (rank 0 writes, everyone waits at a barrier).
        if stopping:  # preempted in the last step (no evaluation due): the adapter is saved within torchrun's 30 s
            stop.at_boundary.set()
        checksum = guards.check_replicas_identical(model.module, progress["step"])
        t_save = time.perf_counter()
        path = save_adapter(model, run_config, progress, cfg.OUTPUT_DIR)
        seconds = log.saved(progress["step"], "adapter", since=t_save)
        replicas = f" identical on all {world} ranks" if world > 1 else ""
        say(
            f"adapter checksum {checksum}{replicas} | saved to {path} in {seconds:.2f}s | "
            f"{seconds_since_launch():.1f} s since launch"  # the whole run, as time_budget.py predicts it
        )
        say(where_everything_is(cfg.OUTPUT_DIR, path, cfg.MODEL_ID, cfg.MODEL_CONFIG))


def run() -> None:
    """main(), with bad input reported as one line (the same on every rank) and exit code 2; so is a model that
    does not fit the GPU before the process group forms (after it, guards.failures_reported says it)."""
    try:
        main()
    except (InputError, torch.OutOfMemoryError) as e:
        line = guards.error_line(e)
        guards.to_stderr(f"[rank {os.environ.get('RANK', 0)}] error: {line}")
        guards.record_for_torchrun(e, line)
        sys.exit(2)


if __name__ == "__main__":
    run()
