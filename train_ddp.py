"""LoRA fine-tuning of Gemma 4 with PyTorch DistributedDataParallel.

    torchrun --standalone --nproc_per_node=2 train_ddp.py               # embedded tiny default, CPU ok
    MODEL_ID=google/gemma-4-12B-it DATA_PATH=chat.jsonl torchrun --nproc_per_node=8 train_ddp.py

Every constant below can be overridden by an environment variable of the same name (torchrun passes
the environment to every rank, so all ranks see the same configuration).
"""

import errno
import functools
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from contextlib import contextmanager, nullcontext, suppress
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

import attention
import guards
import run_record
from collate import IGNORE_INDEX, PadCollate

HERE = Path(__file__).resolve().parent
# Two known, harmless deprecations every rank would print: PEFT reads transformers' old
# is_gradient_checkpointing, and torch 2.13 renames DDP's broadcast_buffers (torch 2.11 knows only it).
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)


def env(name: str, default):
    """The constant `name`: its environment variable if set (parsed as the default's type), else the default.
    A value that does not parse is noted in UNPARSABLE and reported by check_settings(), with the others."""
    raw = os.environ.get(name)
    SOURCES[name] = "default" if raw is None else "env"
    if raw is None:
        return default
    if isinstance(default, bool):
        if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
            UNPARSABLE.append(f"{name}={raw!r}: expected 1/0/true/false")
            return default
        return raw.lower() in ("1", "true", "yes")
    try:
        return type(default)(raw)
    except ValueError:
        UNPARSABLE.append(f"{name}={raw!r}: expected {'an integer' if isinstance(default, int) else 'a number'}")
        return default


SOURCES: dict[str, str] = {}  # constant -> where its value came from: default, env or planner
UNPARSABLE: list[str] = []


# ----------------------------------------------------------------------------------------------
# Constants (override any with NAME=value in the environment)
MODEL_ID = env("MODEL_ID", str(HERE / "assets" / "tiny-gemma4"))  # production: google/gemma-4-12B-it
MODEL_CONFIG = env("MODEL_CONFIG", "")  # a config.json: build that architecture with random weights (benchmarks)
DATA_PATH = env("DATA_PATH", str(HERE / "assets" / "sample_chat.jsonl"))  # chat JSONL, one {"messages": [...]} per line
EVAL_PATH = env("EVAL_PATH", "")  # optional held-out chat JSONL
OUTPUT_DIR = env("OUTPUT_DIR", "out")  # on shared storage for multi-node runs (checkpoints, metrics, adapter)
MAX_LEN = env("MAX_LEN", 2048)  # tokens per sample after the chat template; longer samples are truncated
ASSISTANT_ONLY_LOSS = env("ASSISTANT_ONLY_LOSS", True)  # train on assistant turns only (prompt labels -100)
MICRO_BATCH = env("MICRO_BATCH", 1)  # samples per rank per forward
ACCUM_STEPS = env("ACCUM_STEPS", 8)  # micro-batches per optimizer step; global batch = MICRO_BATCH*ACCUM_STEPS*world
EPOCHS = env("EPOCHS", 2)
MAX_STEPS = env("MAX_STEPS", 0)  # stop after this many optimizer steps (0: run all epochs)
LR = env("LR", 2e-4)
WARMUP_STEPS = env("WARMUP_STEPS", 2)  # linear warmup, then cosine decay to 0
WEIGHT_DECAY = env("WEIGHT_DECAY", 0.0)
GRAD_CLIP = env("GRAD_CLIP", 1.0)  # 0: no clipping
LORA_R = env("LORA_R", 16)
LORA_ALPHA = env("LORA_ALPHA", 32)
LORA_DROPOUT = env("LORA_DROPOUT", 0.05)
# A regex (PEFT full-matches it against module names): the text decoder only. "all-linear" would also
# hit the vision/audio embedders, which a text batch never uses -> DDP error at step 2 (repro/02).
LORA_TARGETS = env("LORA_TARGETS", r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)")
GRADIENT_CHECKPOINTING = env("GRADIENT_CHECKPOINTING", 1)  # checkpoint every Nth decoder layer: 1 all, 2 half, 0 none
CHECKPOINT_OFFLOAD = env("CHECKPOINT_OFFLOAD", False)  # keep checkpointed layer inputs in pinned host memory
# Per-GPU memory target (GiB of allocated memory). When set, memory_budget.py picks MICRO_BATCH (keeping
# MICRO_BATCH*ACCUM_STEPS), GRADIENT_CHECKPOINTING, CHECKPOINT_OFFLOAD and CE_CHUNK_TOKENS: the fastest
# layout predicted to fit. E.g. 24.5 = frugal, 130 = fast on an H200; 0 = use the constants as set.
MEMORY_TARGET_GIB = env("MEMORY_TARGET_GIB", 0.0)
# Global layers (head_dim 512) of right-padded batches: "auto" = ffpa on a GPU with ffpa-attn installed, else
# sdpa (causal, no dense mask); or "ffpa", "sdpa" (attention.py). Sliding layers always use SDPA.
ATTENTION_KERNEL = env("ATTENTION_KERNEL", "auto")
COMPILE_LAYERS = env("COMPILE_LAYERS", False)  # torch.compile each decoder layer (regional): fuses norms, rotary, gelu
CE_CHUNK_TOKENS = env("CE_CHUNK_TOKENS", 1024)  # loss over target positions only, in chunks; 0 = full FP32 logits
LORA_BF16_INPUTS = env(
    "LORA_BF16_INPUTS", True
)  # skip PEFT's FP32 copy of each adapter input (autocast runs bf16 anyway)
GROUP_BY_LENGTH = env("GROUP_BY_LENGTH", True)  # similar lengths share a micro-batch (within one optimizer step)
PAD_TO_MULTIPLE = env("PAD_TO_MULTIPLE", 64)  # fewer distinct shapes: kernels (cuDNN attention) plan once per shape
SEED = env("SEED", 1234)
NUM_WORKERS = env("NUM_WORKERS", 2)  # DataLoader workers per rank (tokenization happens there)
LOG_EVERY = env("LOG_EVERY", 1)
PROFILE_STEP = env("PROFILE_STEP", 0)  # profile this optimizer step: kernel table on rank 0, trace in OUTPUT_DIR
EVAL_EVERY = env("EVAL_EVERY", 0)  # optimizer steps between evaluations (0: only at the end, if EVAL_PATH)
SAVE_EVERY = env("SAVE_EVERY", 0)  # optimizer steps between checkpoints (0: only at epoch ends)
KEEP_CHECKPOINTS = env("KEEP_CHECKPOINTS", 2)  # newest periodic checkpoints kept (at least 1)
RESUME = env("RESUME", "auto")  # "auto": newest intact checkpoint of this run in OUTPUT_DIR; "": never; or a path
RESUME_ALLOW_CHANGES = env("RESUME_ALLOW_CHANGES", False)  # continue a checkpoint of other settings (LR, EPOCHS, data)
SAVE_ON_SIGTERM = env("SAVE_ON_SIGTERM", True)  # SIGTERM/Ctrl-C: finish the step, checkpoint, exit 0 (0: die at once)
NAN_POLICY = env("NAN_POLICY", "skip")  # non-finite loss/grad on any rank: "skip" the update or "stop"
DRIFT_CHECK_EVERY = env("DRIFT_CHECK_EVERY", 50)  # compare adapter checksums across ranks (0: only at the end)
DIST_TIMEOUT_S = env("DIST_TIMEOUT_S", 300)  # after step 1: a collective stuck this long ends the job with a report
DIST_INIT_TIMEOUT_S = env(
    "DIST_INIT_TIMEOUT_S", 1800
)  # until step 1 is done (ranks load and compile at their own pace)


class InputError(Exception):
    """Bad configuration or data. Raised identically on every rank before any collective."""


class OutputDirError(RuntimeError):
    """OUTPUT_DIR could not be written (full, read-only, vanished): reported in one line, not a traceback."""


# What each constant allows, where not every value of its type makes sense.
ALLOWED = {
    "MAX_LEN": (lambda v: v >= 2, ">= 2"),
    "MICRO_BATCH": (lambda v: v >= 1, ">= 1"),
    "ACCUM_STEPS": (lambda v: v >= 1, ">= 1"),
    "EPOCHS": (lambda v: v >= 1, ">= 1"),
    "MAX_STEPS": (lambda v: v >= 0, ">= 0 (0: all epochs)"),
    "LR": (lambda v: 0 < v < 1, "between 0 and 1"),
    "WARMUP_STEPS": (lambda v: v >= 0, ">= 0"),
    "WEIGHT_DECAY": (lambda v: v >= 0, ">= 0"),
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
    "DIST_TIMEOUT_S": (lambda v: v > 0, "> 0"),
    "DIST_INIT_TIMEOUT_S": (lambda v: v > 0, "> 0"),
    "ATTENTION_KERNEL": (lambda v: v in attention.KERNELS, " or ".join(attention.KERNELS)),
}


def check_settings() -> list[str]:
    """Every unparsable or out-of-range constant as one InputError; returns warnings for environment
    variables that look like a misspelled constant (MICROBATCH for MICRO_BATCH)."""
    import difflib

    bad = UNPARSABLE + [
        f"{name}={globals()[name]!r}: allowed {text}"
        for name, (ok, text) in ALLOWED.items()
        if SOURCES[name] != "default" and not ok(globals()[name])
    ]
    if bad:
        raise InputError("; ".join(bad))
    warnings = []
    for var in os.environ:
        close = difflib.get_close_matches(var, SOURCES, n=1, cutoff=0.85)
        if close and var not in SOURCES:
            warnings.append(
                f"warning: {var}={os.environ[var]!r} is not a setting of train_ddp.py; did you mean {close[0]}?"
            )
    return warnings


# ----------------------------------------------------------------------------------------------
# The planner: constants a machine or memory_budget.py chooses, resolved before anything reads them
def plan_settings() -> None:
    """ATTENTION_KERNEL=auto becomes the kernel this machine runs; MEMORY_TARGET_GIB lets memory_budget.py
    choose the layout constants. Same result on every rank; shown as "planner" in the printed settings."""
    choose_attention_kernel()
    if MEMORY_TARGET_GIB > 0:
        apply_memory_target()


def choose_attention_kernel() -> None:
    """ATTENTION_KERNEL=auto becomes the kernel this machine runs (same on every rank); said once."""
    global ATTENTION_KERNEL
    requested = ATTENTION_KERNEL
    try:
        ATTENTION_KERNEL, line = attention.choose(
            requested, torch.device("cuda" if torch.cuda.is_available() else "cpu")
        )
    except ValueError as e:
        raise InputError(f"ATTENTION_KERNEL={requested}: {e}") from None
    if requested == "auto":
        SOURCES["ATTENTION_KERNEL"] = "planner"
    rank0_print(line)


def apply_memory_target() -> None:
    """MEMORY_TARGET_GIB: let memory_budget.py choose the layout constants (same on every rank)."""
    global MICRO_BATCH, ACCUM_STEPS, GRADIENT_CHECKPOINTING, CHECKPOINT_OFFLOAD, CE_CHUNK_TOKENS
    import memory_budget

    source = MODEL_CONFIG or MODEL_ID
    try:
        plan = memory_budget.plan_for_memory_target(
            memory_budget.param_shapes_from_path(source),
            memory_budget.load_config(source),
            MEMORY_TARGET_GIB,
            seq_len=MAX_LEN,
            samples_per_step=MICRO_BATCH * ACCUM_STEPS,
            world_size=int(os.environ["WORLD_SIZE"]),
            lora_r=LORA_R,
            targets=LORA_TARGETS,
            lora_dropout=LORA_DROPOUT,
            attention=ATTENTION_KERNEL,
        )
    except ValueError as e:
        raise InputError(f"MEMORY_TARGET_GIB={MEMORY_TARGET_GIB}: {e}") from None
    layout = plan["layout"]
    MICRO_BATCH, ACCUM_STEPS, GRADIENT_CHECKPOINTING = layout.micro_batch, plan["accum"], layout.ckpt_every
    CHECKPOINT_OFFLOAD, CE_CHUNK_TOKENS = layout.offload, layout.ce_chunk_tokens
    SOURCES.update(
        dict.fromkeys(
            ["MICRO_BATCH", "ACCUM_STEPS", "GRADIENT_CHECKPOINTING", "CHECKPOINT_OFFLOAD", "CE_CHUNK_TOKENS"], "planner"
        )
    )
    rank0_print(f"MEMORY_TARGET_GIB={MEMORY_TARGET_GIB}: predicted peak {plan['peak_bytes'] / 2**30:.1f} GiB")


# ----------------------------------------------------------------------------------------------
# Distributed setup
def rank_info() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment; a plain `python train_ddp.py` is rank 0 of 1."""
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=os.environ.get("MASTER_PORT", "29511"),
        )
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])


def init_distributed(device: torch.device) -> None:
    """NCCL bound to this rank's GPU, gloo on CPU. The flight recorder keeps each rank's last collectives
    (read by HangWatchdog, dumped to OUTPUT_DIR when a collective times out)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(Path(OUTPUT_DIR).resolve() / "flight_recorder_rank_"))
    if device.type == "cuda":
        dist.init_process_group("nccl", timeout=backend_timeout(DIST_INIT_TIMEOUT_S), device_id=device)
    else:
        dist.init_process_group("gloo", timeout=backend_timeout(DIST_INIT_TIMEOUT_S))


NCCL_BACKSTOP_S = 60


def backend_timeout(seconds: float) -> timedelta:
    """gloo raises in Python at its timeout. NCCL's timeout can only abort the process (SIGABRT, C++ frames),
    so HangWatchdog reports first and NCCL's own timeout stays a backstop, NCCL_BACKSTOP_S later."""
    return timedelta(seconds=seconds + (NCCL_BACKSTOP_S if torch.cuda.is_available() else 0))


def set_collective_timeout(seconds: float, watchdog: "HangWatchdog") -> None:
    dist.distributed_c10d._set_pg_timeout(backend_timeout(seconds))  # what torchtitan does after its first step
    watchdog.timeout_s = seconds


def flight_recorder(json_format: bool = True, **kwargs):
    """This rank's flight recorder dump: NCCL's recorder on GPUs, the generic one (gloo) on CPU."""
    c10d = torch._C._distributed_c10d
    names = ["_dump_nccl_trace", "_dump_fr_trace"] if torch.cuda.is_available() else ["_dump_fr_trace"]
    names = [n + ("_json" if json_format else "") for n in names]
    return getattr(c10d, next(n for n in names if hasattr(c10d, n)))(**kwargs)


class HangWatchdog(threading.Thread):
    """Ends this rank with a short report when a collective has waited longer than the timeout.

    gloo raises inside a stuck collective, on the main thread, which reports it. NCCL does not: the
    wait happens on the GPU, and NCCL's own watchdog thread ends the process with a SIGABRT and pages
    of C++ frames, a minute or more after the timeout. This thread reads the flight recorder every
    2 s: a collective pending longer than the timeout (on gloo 5 s more: its own error comes first)
    ends the rank with the report. It also posts how many collectives this rank has entered to the
    rendezvous store (plain TCP), so a report can name the ranks that never joined, and beats there, so
    peers can tell that this process still lives.
    """

    def __init__(self, rank: int, world: int):
        super().__init__(daemon=True, name="hang-watchdog")
        self.rank, self.world, self.timeout_s = rank, world, DIST_INIT_TIMEOUT_S
        self.grace_s = 0 if torch.cuda.is_available() else 5
        attempt = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        client = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=10)
        )
        self.store = dist.PrefixStore(f"hang-watchdog/{attempt}/", client)
        self.stopped = threading.Event()
        self.posted = None

    def state(self, only_pending: bool = True) -> tuple[list[dict], int]:
        """(collectives in the flight recorder, oldest first; number of the last one this rank entered)."""
        trace = json.loads(flight_recorder(includeCollectives=True, onlyActive=only_pending))
        entries = sorted(
            (e for e in trace.get("entries", []) if not (only_pending and e.get("retired"))),
            key=lambda e: e["collective_seq_id"],
        )
        entered = max((int(s["last_enqueued_collective"]) for s in trace.get("pg_status", {}).values()), default=0)
        return entries, entered

    def run(self) -> None:
        launcher_gone = False
        while not self.stopped.wait(2.0):
            pending, entered = self.state()
            try:
                if not launcher_gone:
                    self.store.add(f"beats/{self.rank}", 1)
                    if entered != self.posted:
                        self.store.set(f"entered/{self.rank}", str(entered))
                        self.posted = entered
            except (RuntimeError, OSError) as e:  # the store lives in torchrun's agent: the launcher is gone
                launcher_gone = True
                STOP.request("the loss of the launcher")
                print(
                    f"[rank {self.rank}] the launcher is gone (its store does not answer: {type(e).__name__}): "
                    f"stopping after this step with a checkpoint ({step_position()})",
                    file=sys.stderr,
                    flush=True,
                )
            if pending and time.time_ns() - pending[0]["time_created_ns"] > (self.timeout_s + self.grace_s) * 1e9:
                main = sys._current_frames().get(threading.main_thread().ident)
                calls = [f"{f.name} (line {f.lineno})" for f in traceback.extract_stack(main) if f.filename == __file__]
                report = f"collective timeout {step_position()}: {self.describe(pending[0])}"
                cause = self.first_failure()
                print(
                    f"[rank {self.rank}] {report}\n[rank {self.rank}] main thread: {' -> '.join(calls)}"
                    + (f"\n[rank {self.rank}] {cause}" if cause else ""),
                    file=sys.stderr,
                    flush=True,
                )
                record_for_torchrun(TimeoutError(report))
                os._exit(1)  # nothing else can unblock a main thread that waits on the GPU

    def post_failure(self, line: str) -> None:
        """Tell the peers why this rank is ending (they print it: the root cause appears on every rank)."""
        with suppress(RuntimeError, OSError):  # the store's host may be gone too
            self.store.set(f"failure/{self.store.add('failures', 1)}", f"rank {self.rank} failed: {line}")

    def first_failure(self) -> str:
        """The first failure any rank posted ("" if none did): what the others' errors follow from."""
        with suppress(RuntimeError, OSError):
            if self.store.add("failures", 0):
                return self.store.get("failure/1").decode()
        return ""

    def heartbeats(self) -> dict[int, int]:
        """Every rank's beat count: one that stops growing belongs to a process that is gone. ({} when the store
        does not answer: the launcher, which holds it, is gone, and with it what tells a dead peer.)"""
        try:
            return {r: self.store.add(f"beats/{r}", 0) for r in range(self.world)}
        except (RuntimeError, OSError):
            return {}

    def stopped_beating(self, before: dict[int, int], now: dict[int, int]) -> list[int]:
        """The peers whose beat did not grow from `before` to `now` (two heartbeats() readings)."""
        return [r for r in now if now[r] == before.get(r) and r != self.rank]

    def peers_gone(self, window_s: float = 3.0) -> list[int]:
        """The peers whose beat did not grow over `window_s` (a beat comes every 2 s)."""
        before = self.heartbeats()
        time.sleep(window_s)
        return self.stopped_beating(before, self.heartbeats())

    def describe_failure(self) -> str:
        """After an exception: the last collective, if it waited long enough for every rank to post its
        count (a few seconds) and some rank never entered it; else ""."""
        entries, _ = self.state(only_pending=False)
        if not entries or time.time_ns() - entries[-1]["time_created_ns"] < 5e9:
            return ""
        return self.describe(entries[-1]) if self.ranks_behind(entries[-1]["collective_seq_id"]) else ""

    def ranks_behind(self, seq: int) -> list[int] | str:
        """The ranks whose last posted collective number is below `seq`: they never entered it."""
        try:
            posted = {
                r: int(self.store.get(f"entered/{r}")) for r in range(self.world) if self.store.check([f"entered/{r}"])
            }
        except (RuntimeError, OSError) as err:  # the store's host is gone too
            return f"unknown ({type(err).__name__})"
        return [r for r in range(self.world) if posted.get(r, 0) < seq]

    def describe(self, e: dict) -> str:
        """One collective, the ranks that never entered it and where this rank's flight recorder is."""
        seq, age = e["collective_seq_id"], (time.time_ns() - e["time_created_ns"]) / 1e9
        with suppress(RuntimeError, OSError):  # the store's host may be gone too
            self.store.set(f"entered/{self.rank}", str(self.state()[1]))  # this rank's own count, fresh
        dump = Path(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(self.rank))
        try:  # NCCL's own dump would come only at its backstop
            dump.write_bytes(flight_recorder(json_format=False))
        except OSError:  # OUTPUT_DIR unwritable: the report must still come
            dump = Path(tempfile.gettempdir()) / f"{dump.name}_{os.getpid()}"
            dump.write_bytes(flight_recorder(json_format=False))
        missing = self.ranks_behind(seq) or "none (all entered it; one is stuck inside it)"
        return (
            f"{e['profiling_name']} #{seq} (sizes {e['input_sizes']}, issued {age:.0f} s ago); ranks that never "
            f"entered it: {missing}; flight recorder dump: {dump} (a pickle of this rank's last collectives)"
        )

    def stop(self) -> None:
        self.stopped.set()


class GracefulStop:
    """Preemption (SIGTERM, what clusters and torchrun send), Ctrl-C or a lost launcher (HangWatchdog): every
    rank finishes its step (all learn of it in that step's last all-reduce), rank 0 checkpoints, all exit 0.

    A Python signal handler runs only when the main thread returns to Python, which a rank blocked in
    a collective (on NCCL, on the GPU) never does. So the signal is read from the interpreter's wakeup
    pipe by a thread of its own. torchrun also sends SIGTERM to the survivors when a worker died; they
    wait on the dead peer and never reach the end of the step: a signalled rank checks every 5 s, and
    a peer that stopped beating (HangWatchdog.heartbeats), or 25 s without a step boundary (torchrun
    SIGKILLs at 30 s), ends it without a checkpoint. A second Ctrl-C stops at once; repeated SIGTERMs
    (a cluster signals every process, torchrun its workers again) change nothing.
    """

    GRACE_S, CHECK_S = 25.0, 5.0

    def __init__(self):
        self.signal, self.requested, self.watchdog, self.at_boundary = None, None, None, threading.Event()

    @property
    def reason(self) -> str | None:
        """Why the job stops at the end of this step (None: it does not)."""
        return self.signal.name if self.signal else self.requested

    def request(self, reason: str) -> None:
        """Stop at the end of this step with a checkpoint, as on SIGTERM (every rank learns it in the step's
        last all-reduce)."""
        self.requested = self.requested or reason

    def install(self, watchdog: "HangWatchdog") -> None:
        self.watchdog = watchdog
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: None)  # the work happens in _watch
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)  # written by the C handler, at once
        threading.Thread(target=self._watch, args=(read_end,), daemon=True, name="graceful-stop").start()

    def _watch(self, read_end: int) -> None:
        while True:
            signum = os.read(read_end, 1)[0]  # every signal with a Python handler (DataLoader's SIGCHLD too)
            if signum not in (signal.SIGTERM, signal.SIGINT):
                continue
            if self.signal is None:
                self.signal = signal.Signals(signum)
                threading.Thread(target=self._exit_if_stuck, daemon=True).start()
            elif signum == signal.SIGINT:
                os._exit(128 + signum)

    def _exit_if_stuck(self) -> None:
        start, before = time.monotonic(), self.watchdog.heartbeats()
        while not self.at_boundary.wait(self.CHECK_S):
            now = self.watchdog.heartbeats()
            gone = self.watchdog.stopped_beating(before, now)
            if gone or time.monotonic() - start > self.GRACE_S:
                why = f"rank(s) {gone} stopped beating" if gone else f"no step boundary within {self.GRACE_S:.0f} s"
                cause = self.watchdog.first_failure()
                print(
                    f"[rank {self.watchdog.rank}] {self.signal.name}: {why} ({step_position()}); "
                    f"exiting without a checkpoint" + (f"\n[rank {self.watchdog.rank}] {cause}" if cause else ""),
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(128 + self.signal.value)
            before = now


STOP = GracefulStop()


def step_position() -> str:
    step, done = _step["current"], _step["completed"]
    where = f"in optimizer step {step}" if step != done else f"after optimizer step {done}"
    return f"{where}; last completed step: {done}"


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """One small all-reduce for a handful of scalars (float64, so token counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def check_model_source() -> None:
    """A model folder that does not exist, or a hub id that is not cached while offline, fails at once
    (transformers would try the hub for either, and wait on the network)."""
    if MODEL_CONFIG:
        if not Path(MODEL_CONFIG).is_file():
            raise InputError(f"MODEL_CONFIG {MODEL_CONFIG!r}: no such file")
        return
    if Path(MODEL_ID).exists():
        return
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", MODEL_ID) or MODEL_ID.startswith("."):
        raise InputError(f"MODEL_ID {MODEL_ID!r}: no such folder (a hub id looks like google/gemma-4-12B-it)")
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(MODEL_ID, "config.json"), str):
        return
    if constants.HF_HUB_OFFLINE:
        raise InputError(
            f"MODEL_ID {MODEL_ID!r}: not in the local hub cache, and HF_HUB_OFFLINE is set: download "
            f"it first (huggingface-cli download {MODEL_ID}) or point MODEL_ID to a local folder"
        )
    try:  # one quick question to the hub, instead of transformers' retries on an unreachable one
        HfApi().model_info(MODEL_ID, timeout=10)
    except RepositoryNotFoundError:
        raise InputError(f"MODEL_ID {MODEL_ID!r}: no such folder here, and no such model on the hub") from None
    except Exception as e:  # network errors: httpx's, requests', OSError
        raise InputError(
            f"MODEL_ID {MODEL_ID!r}: no such folder here, and the hub did not answer ({type(e).__name__}: {e}); "
            f"check the path, or the network (HF_HUB_OFFLINE=1 uses a cached copy)"
        ) from None


def check_writable(directory: str) -> None:
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        probe = Path(directory) / f".write_probe_{socket.gethostname()}_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise InputError(f"OUTPUT_DIR {directory!r} is not writable: {e}") from e


# ----------------------------------------------------------------------------------------------
# Data: chat JSONL -> chat template -> token ids + labels (assistant turns only)
ROLES = ("system", "user", "assistant")


def load_conversations(path: str) -> list[list[dict]]:
    """Parse and validate every row up front, so bad data fails on every rank before training starts."""
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as e:
        raise InputError(f"cannot read data file {path}: {e}") from e
    rows = []
    for lineno, raw in enumerate(lines, 1):
        where = f"{path}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(
                f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); save the file as UTF-8"
            ) from None
        if not line.strip():
            continue
        if not rows and line.lstrip().startswith("["):
            raise InputError(
                f"{where}: a JSON array; this script reads JSON Lines, one object per line. Convert: "
                f'python -c "import json,sys; [print(json.dumps(r)) for r in json.load(open(sys.argv[1]))]" '
                f"{path} > {Path(path).stem}.jsonl"
            )
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list) or not messages:
            raise InputError(f"{where}: expected an object with a non-empty 'messages' list{format_hint(row)}")
        for j, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES:
                role = m.get("role") if isinstance(m, dict) else m
                raise InputError(f"{where}: message {j}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
            if not isinstance(m.get("content"), str):
                raise InputError(f"{where}: message {j}: 'content' must be a string")
        if messages[0]["role"] == "assistant":
            raise InputError(f"{where}: message 0 is from the assistant; a conversation starts with system or user")
        if not any(m["role"] == "assistant" for m in messages):
            raise InputError(f"{where}: no assistant message, nothing to train on")
        rows.append(messages)
    if not rows:
        raise InputError(f"{path}: no examples (the file is empty)")
    return rows


def format_hint(row) -> str:
    """How to turn the other two formats people bring into 'messages' rows."""
    if isinstance(row, dict) and isinstance(row.get("conversations"), list):
        return (
            "; this looks like ShareGPT: rename 'conversations' to 'messages', 'from' to 'role' and 'value' to "
            "'content', with roles human -> user, gpt -> assistant"
        )
    if isinstance(row, dict) and {"prompt", "completion"} <= row.keys():
        return (
            '; this looks like prompt/completion: write {"messages": [{"role": "user", "content": prompt}, '
            '{"role": "assistant", "content": completion}]} (the loss then covers the completion only)'
        )
    return ""


def tokenize_conversation(tokenizer, messages: list[dict], max_len: int, assistant_only: bool) -> dict:
    """Token ids and labels for one conversation. With assistant_only, labels are -100 except on each
    assistant turn's tokens through its end-of-turn token (the template emits <bos>: never add it twice)."""

    def render(msgs, add_generation_prompt=False):
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    input_ids = render(messages)
    if not assistant_only:
        labels = list(input_ids)
    else:
        labels = [IGNORE_INDEX] * len(input_ids)
        end_of_turn = tokenizer.convert_tokens_to_ids("<turn|>")
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            start = len(render(messages[:i], add_generation_prompt=True))
            upto = render(messages[: i + 1])
            if upto != input_ids[: len(upto)]:
                raise InputError("chat template is not prefix-stable; cannot locate assistant turns")
            turn = upto[start:]
            end = start + (len(turn) - turn[::-1].index(end_of_turn) if end_of_turn in turn else len(turn))
            labels[start:end] = input_ids[start:end]
    return {"input_ids": input_ids[:max_len], "labels": labels[:max_len]}


class ChatDataset(Dataset):
    """Conversations tokenized lazily (in DataLoader workers), so skipped samples cost nothing."""

    def __init__(self, conversations, tokenizer, max_len: int, assistant_only: bool):
        self.conversations, self.tokenizer = conversations, tokenizer
        self.max_len, self.assistant_only = max_len, assistant_only
        self.lengths = [sum(len(m["content"]) for m in c) for c in conversations]  # characters: no tokenizing

    def __len__(self):
        return len(self.conversations)

    def __getitem__(self, i):
        return tokenize_conversation(self.tokenizer, self.conversations[i], self.max_len, self.assistant_only)


class StepOrder(Sampler):
    """A rank's DistributedSampler order, without its first `skip` indices (resuming mid-epoch).

    With `lengths`, each window of `window` samples (one optimizer step of this rank) is sorted by
    length: similar lengths share a micro-batch (less padding), while the samples of every optimizer
    step, and so the update, stay exactly those of the shuffled order.
    """

    def __init__(self, sampler: DistributedSampler, skip: int, lengths: list[int] | None = None, window: int = 1):
        self.sampler, self.skip, self.lengths, self.window = sampler, skip, lengths, window

    def __iter__(self):
        order = list(self.sampler)
        if self.lengths is not None:
            order = [
                i
                for start in range(0, len(order), self.window)
                for i in sorted(order[start : start + self.window], key=lambda i: -self.lengths[i])
            ]
        return iter(order[self.skip :])

    def __len__(self):
        return len(self.sampler) - self.skip


def train_loader(
    dataset, rank: int, world: int, epoch: int, skip_samples: int, collate: PadCollate, lengths: list[int] | None = None
) -> DataLoader:
    # drop_last twice: the sampler gives every rank the same number of samples, the loader the
    # same number of full micro-batches, so every rank runs the same number of steps (no hang).
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=SEED, drop_last=True)
    sampler.set_epoch(epoch)
    order = StepOrder(sampler, skip_samples, lengths, window=MICRO_BATCH * ACCUM_STEPS)
    return DataLoader(
        dataset,
        batch_size=MICRO_BATCH,
        sampler=order,
        drop_last=True,
        collate_fn=collate,
        num_workers=NUM_WORKERS,
        worker_init_fn=guards.loader_worker_init(os.getpid()),  # they live and die with this rank
        persistent_workers=False,
        pin_memory=torch.cuda.is_available(),
    )


def data_summary(tokenizer, conversations: list, used_per_epoch: int, sample_size: int = 1000) -> str:
    """What MAX_LEN and drop_last do to the data, from up to `sample_size` rows spread over the file (the
    same rows on every rank; this also checks the chat template). Stops when no row keeps a target."""
    sample = conversations[:: max(1, len(conversations) // sample_size)]
    cut = targets = kept = no_target = 0
    for messages in sample:
        labels = tokenize_conversation(tokenizer, messages, 1 << 30, ASSISTANT_ONLY_LOSS)["labels"]
        row_targets = sum(label != IGNORE_INDEX for label in labels[1:])  # position t predicts token t+1
        row_kept = sum(label != IGNORE_INDEX for label in labels[1:MAX_LEN])
        cut, targets, kept, no_target = (
            cut + (len(labels) > MAX_LEN),
            targets + row_targets,
            kept + row_kept,
            no_target + (row_kept == 0),
        )
    if kept == 0:
        raise InputError(
            f"{DATA_PATH}: no row keeps a target token within MAX_LEN={MAX_LEN} (the assistant turns "
            f"come later): raise MAX_LEN"
        )
    return (
        f"data: {len(conversations)} rows; of {len(sample)} sampled, {cut} longer than MAX_LEN={MAX_LEN} "
        f"({targets - kept} of {targets} target tokens cut), {no_target} with no target left; "
        f"{len(conversations) - used_per_epoch} rows per epoch left out by drop_last"
    )


def steps_per_epoch(n_samples: int, world: int) -> int:
    """Optimizer steps per epoch, identical on every rank; a partial accumulation window is dropped."""
    per_step = world * MICRO_BATCH * ACCUM_STEPS
    if n_samples // per_step == 0:
        raise InputError(
            f"{DATA_PATH}: {n_samples} samples, but one optimizer step needs "
            f"world_size*MICRO_BATCH*ACCUM_STEPS = {world}*{MICRO_BATCH}*{ACCUM_STEPS} = {per_step}"
        )
    return (n_samples // world // MICRO_BATCH) // ACCUM_STEPS


# ----------------------------------------------------------------------------------------------
# Model: Gemma 4 + regex-scoped LoRA, wrapped with its loss so DDP sees one forward
def load_model(device: torch.device):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    if os.environ.get("RANK", "0") != "0":
        hf_logging.disable_progress_bar()  # the weight-loading bar once, on rank 0

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    implementation = attention.register(attention.choose(ATTENTION_KERNEL, device)[0])
    if MODEL_CONFIG:  # random weights, same on every rank (same seed); DDP broadcasts rank 0's anyway
        torch.manual_seed(SEED)
        with device:
            model = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(MODEL_CONFIG), dtype=dtype, attn_implementation=implementation
            )
    else:
        model = AutoModelForCausalLM.from_pretrained(
            MODEL_ID, dtype=dtype, device_map={"": device}, attn_implementation=implementation
        )
    model.config.use_cache = False
    return model


def add_lora(model):
    """Freeze the base model and add LoRA adapters on the modules LORA_TARGETS full-matches."""
    from peft import LoraConfig, get_peft_model

    targets = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and re.fullmatch(LORA_TARGETS, n)]
    if not targets:
        examples = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)][:3]
        raise InputError(f"LORA_TARGETS {LORA_TARGETS!r} matches no Linear module (names look like {examples})")
    if GRADIENT_CHECKPOINTING:  # non-reentrant: works with DDP, no_sync and frozen inputs
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False},
            every_n_layers=GRADIENT_CHECKPOINTING,
            offload=CHECKPOINT_OFFLOAD,
        )
    config = LoraConfig(
        r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=LORA_DROPOUT, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
    )
    peft_model = get_peft_model(model, config)  # adapters are FP32 even on a BF16 base (PEFT's default)
    if LORA_BF16_INPUTS:  # PEFT casts each input to the FP32 adapter dtype, then autocast casts it back
        for module in peft_model.modules():
            if hasattr(module, "cast_input_dtype_enabled"):
                module.cast_input_dtype_enabled = False
    if COMPILE_LAYERS:  # after PEFT (the adapters are part of each layer), before DDP
        for layer in peft_model.get_base_model().get_decoder().layers:
            layer.compile()
    return peft_model


class CausalLMLoss(torch.nn.Module):
    """forward(batch) -> (loss SUM over this micro-batch's targets, number of targets).

    The loss lives inside the module DDP wraps, so DDP's forward prepares the gradient reduction.
    With CE_CHUNK_TOKENS > 0 only target positions reach the LM head, in chunks whose FP32 logits are
    recomputed in backward: the (tokens x 262,144) FP32 logits are never materialised at once.
    """

    def __init__(self, peft_model):
        super().__init__()
        self.lm = peft_model
        causal_lm = peft_model.get_base_model()
        self.decoder, self.lm_head = causal_lm.model, causal_lm.get_output_embeddings()
        self.softcap = causal_lm.config.get_text_config().final_logit_softcapping

    def logits_loss_sum(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")

    def forward(self, input_ids, attention_mask, labels, right_padded=False):
        hidden = self.decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, right_padded=right_padded
        ).last_hidden_state
        hidden, targets = hidden[:, :-1], labels[:, 1:]  # position t predicts token t+1
        n_targets = (targets != IGNORE_INDEX).sum()
        if CE_CHUNK_TOKENS <= 0:
            return self.logits_loss_sum(hidden, targets), n_targets
        keep = targets != IGNORE_INDEX
        hidden, targets = hidden[keep], targets[keep]
        # No target here (an assistant turn cut off by MAX_LEN): a zero that still reaches every adapter,
        # so backward runs and DDP's reducer gets the (zero) gradients it waits for.
        loss = hidden.float().sum() * 0.0
        for i in range(0, targets.numel(), CE_CHUNK_TOKENS):
            loss = loss + checkpoint(
                self.logits_loss_sum,
                hidden[i : i + CE_CHUNK_TOKENS],
                targets[i : i + CE_CHUNK_TOKENS],
                use_reentrant=False,
            )
        return loss, n_targets


def wrap_ddp(peft_model, device: torch.device) -> DDP:
    """DDP around CausalLMLoss. broadcast_buffers=False: Gemma's buffers (embedding scale, rotary tables) are
    constants, identical on every rank; re-broadcasting them every step would be a collective for nothing."""
    return DDP(
        CausalLMLoss(peft_model),
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        broadcast_buffers=False,
    )


def trainable_state(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def adapter_checksum(model) -> str:
    """SHA-256 of every trainable tensor's bytes, in name order: equal only if bit-identical."""
    h = hashlib.sha256()
    for name, p in sorted(trainable_state(model).items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def check_replicas_identical(model, step: int) -> str:
    """All-gather the adapter checksum; stop every rank with the same error if any replica differs."""
    mine = adapter_checksum(model)
    sums = [None] * dist.get_world_size()
    dist.all_gather_object(sums, mine)
    if len(set(sums)) > 1:
        # Name the ranks outside the largest agreeing group (ties: rank 0's group), not "all but rank 0".
        majority = max(set(sums), key=lambda s: (sums.count(s), s == sums[0]))
        differing = [r for r, s in enumerate(sums) if s != majority]
        raise RuntimeError(
            f"replica drift at step {step}: adapter weights on rank(s) {differing} differ from "
            f"the other ranks' (checksums by rank: {sums})"
        )
    return mine


def on_device(batch: dict, device: torch.device) -> dict:
    """The batch on `device`, with right_padded checked on the CPU copy (no GPU sync): only then may the
    global layers drop the dense mask for a causal kernel (attention.py)."""
    mask = batch["attention_mask"]
    right_padded = bool((mask[:, 1:] <= mask[:, :-1]).all())
    return {**{k: v.to(device, non_blocking=True) for k, v in batch.items()}, "right_padded": right_padded}


def autocast(device: torch.device):
    """bf16 autocast on GPU (adapters stay FP32, no GradScaler needed); plain FP32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


# ----------------------------------------------------------------------------------------------
# One optimizer step: no_sync accumulation with a token-weighted global loss
def forward_backward(model: DDP, micro_batches: list[dict], device: torch.device) -> tuple[float, tuple, bool]:
    """Forward+backward over one accumulation window. Returns the loss sum, (targets, non-pad tokens, padded
    tokens), each summed over all ranks, and whether any rank was asked to stop (SIGTERM/SIGINT).

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
    loss_sum_all, stops = all_reduce_sum([local_loss.item(), STOP.reason is not None], device)
    return loss_sum_all, (n_targets, n_tokens, n_padded), stops > 0


_step = {"current": 0, "completed": 0}  # where the loop is, for the failure report


# ----------------------------------------------------------------------------------------------
# Evaluation: each rank its own shard, each example exactly once, through model.module
@torch.no_grad()
def evaluate(model: DDP, dataset: Dataset, collate: PadCollate, device: torch.device) -> dict:
    """Token-weighted eval loss over the whole file: equals a single-process evaluation.

    Indices rank, rank+world, ... (no DistributedSampler padding, which would count examples twice);
    model.module, never the DDP forward (which would expect a backward and a matching collective).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = DataLoader(
        torch.utils.data.Subset(dataset, range(rank, len(dataset), world)), batch_size=MICRO_BATCH, collate_fn=collate
    )
    was_training = model.training
    model.eval()
    loss, targets = 0.0, 0
    for batch in loader:
        with autocast(device):
            s, n = model.module(**on_device(batch, device))
        loss, targets = loss + float(s), targets + int(n)
    model.train(was_training)
    loss, targets = all_reduce_sum([loss, targets], device)
    mean = loss / max(targets, 1.0)
    return {"eval_loss": mean, "eval_ppl": math.exp(min(mean, 50.0)), "eval_targets": int(targets)}


# ----------------------------------------------------------------------------------------------
# Checkpoints: rank 0 writes into a temporary folder, then renames it into place (atomic)
def publish_atomically(final: Path, write, expected_bytes: int) -> None:
    """Rank 0 only: write(folder) fills a temporary folder, which gets a manifest (size and SHA-256 of
    every file), is fsynced and renamed into place: `final` is the previous complete version or the new
    complete one, never a half-written one. A failed write removes the temporary folder and says why."""
    tmp, old = final.with_name(f".tmp-{final.name}"), final.with_name(f".old-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        run_record.write_manifest(tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as "basic_ios::clear: iostream error"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            free = shutil.disk_usage(final.parent).free
        except OSError:  # the folder vanished
            free = None
        full = getattr(e, "errno", None) == errno.ENOSPC or (free is not None and free < expected_bytes)
        cause = "no space left on the device" if full else str(e).splitlines()[0]
        space = f"{readable_size(free)} free in {final.parent}, " if free is not None else ""
        kept = sorted(final.parent.glob(final.name.split("-")[0] + "*"))  # step-* or adapter: what survives
        raise OutputDirError(
            f"saving {final} failed: {cause} ({space}this save needs about {readable_size(expected_bytes)}); "
            f"the temporary folder is removed"
            + (f" and {kept[-1].name} kept" if kept else "; there is no earlier one to keep")
        ) from e
    shutil.rmtree(old, ignore_errors=True)  # left over by a crash during an earlier replacement
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    dir_fd = os.open(final.parent, os.O_RDONLY)
    os.fsync(dir_fd)  # make the rename itself durable
    os.close(dir_fd)
    shutil.rmtree(old, ignore_errors=True)


def readable_size(n_bytes: float) -> str:
    """Bytes as a person reads them: 544 KiB, 1.2 MiB, 3.4 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            return f"{n_bytes:,.0f} {unit}" if unit in ("B", "KiB") else f"{n_bytes:,.1f} {unit}"
        n_bytes /= 1024


def adapter_bytes(model: DDP) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def save_checkpoint(model: DDP, optimizer, progress: dict, run_config: dict) -> Path:
    """Adapter + optimizer state and progress, as OUTPUT_DIR/checkpoints/step-N; the oldest pruned. (No
    scheduler state: the schedule is a function of the settings and the step, re-derived on resume.)"""
    final = Path(OUTPUT_DIR) / "checkpoints" / f"step-{progress['step']:08d}"
    if dist.get_rank() == 0:

        def write(folder: Path) -> None:
            model.module.lm.save_pretrained(folder)  # model.module unwraps DDP
            torch.save(
                {"optimizer": optimizer.state_dict(), "progress": progress},
                folder / "trainer_state.pt",
            )
            write_run_record(folder, run_config, progress)

        final.parent.mkdir(exist_ok=True)  # not parents: an OUTPUT_DIR that vanished is an error, not made anew
        publish_atomically(final, write, expected_bytes=3 * adapter_bytes(model))  # adapter + AdamW's 2 moments
        # prune only older checkpoints: after a rollback (RESUME=older step) the new one must survive
        older = [p for p in sorted(final.parent.glob("step-*")) if p.name < final.name]
        for stale in older[: max(len(older) - KEEP_CHECKPOINTS + 1, 0)]:
            shutil.rmtree(stale)
    dist.barrier()  # nobody reads (or moves on) before the checkpoint is complete
    return final


def write_run_record(folder: Path, run_config: dict, progress: dict) -> None:
    """folder/run.json: the run's settings and identity, and how far it got (read by resume and reruns)."""
    (folder / "run.json").write_text(json.dumps({**run_config, "progress": progress}, indent=1, default=str))


def save_adapter(model: DDP, run_config: dict, progress: dict) -> Path:
    """The final adapter as OUTPUT_DIR/adapter, loadable with PeftModel.from_pretrained, with the run's record
    (run.json: settings, identity, progress): what a rerun reads to know the run is complete."""
    final = Path(OUTPUT_DIR) / "adapter"
    if dist.get_rank() == 0:

        def write(folder: Path) -> None:
            model.module.lm.save_pretrained(folder)
            write_run_record(folder, run_config, progress)

        publish_atomically(final, write, expected_bytes=adapter_bytes(model))
    dist.barrier()
    return final


def finished_run(identity: dict, total_steps: int) -> str | None:
    """With RESUME=auto: None if this run has steps left; else "" when OUTPUT_DIR holds its complete adapter,
    or a note when the data differ from those it was trained on (the run is complete all the same)."""
    adapter = Path(OUTPUT_DIR) / "adapter"
    if RESUME != "auto" or not (adapter / "run.json").is_file() or run_record.damage(adapter) is not None:
        return None
    record = json.loads((adapter / "run.json").read_text())
    changes = run_record.differences(record["identity"], identity)
    data = [c for c in changes if c.startswith("data_sha256")]
    if record["progress"]["step"] < total_steps or len(changes) > len(data):
        return None
    return f"; DATA_PATH's content differs from the data it was trained on ({DATA_PATH})" if data else ""


def find_resume_checkpoint(identity: dict) -> Path | None:
    """The checkpoint to continue: RESUME's path or, with "auto", the newest intact one in OUTPUT_DIR
    (damaged newer ones are named and skipped). One written by another run (see run_record.identity)
    is named and refused, unless RESUME_ALLOW_CHANGES allows the differences."""
    if not RESUME:
        return None
    if RESUME == "auto":
        found = sorted((Path(OUTPUT_DIR) / "checkpoints").glob("step-*"), reverse=True)  # .tmp-* never match
        damaged = {path: run_record.damage(path) for path in found}
        for path, problem in damaged.items():
            if problem is None:
                break
            rank0_print(f"warning: skipping damaged checkpoint {path}: {problem}")
        else:
            if found:
                raise InputError(
                    f"every checkpoint in {found[0].parent} is damaged (newest: {damaged[found[0]]}); "
                    f"move them away, or start fresh with RESUME=''"
                )
            return None
    else:
        path = Path(RESUME)
        if (problem := run_record.damage(path)) is not None:
            raise InputError(f"RESUME={RESUME!r} is not an intact checkpoint folder: {problem}")
    saved = json.loads((path / "run.json").read_text())
    changes = run_record.differences(saved["identity"], identity)
    if saved.get("progress", {}).get("step_in_epoch"):  # mid-epoch: a new shuffle would repeat and skip rows
        changes = [f"{c} (mid-epoch: cannot change)" if c.startswith("SEED:") else c for c in changes]
    fixed = [c for c in changes if c.split(":")[0] in run_record.STRUCTURAL or c.endswith("cannot change)")]
    if fixed or (changes and not RESUME_ALLOW_CHANGES):
        allow = "" if fixed else "continue it with these changes with RESUME_ALLOW_CHANGES=1, "
        raise InputError(
            f"{path} was written by another run ({'; '.join(changes)}): {allow}start fresh with "
            f"RESUME='', or use another OUTPUT_DIR"
        )
    if changes:
        rank0_print(f"warning: resuming {path} with changed settings (RESUME_ALLOW_CHANGES=1): {'; '.join(changes)}")
    return path


def acquire_output_lock() -> run_record.OutputLock:
    """Rank 0: OUTPUT_DIR/.lock, or an InputError naming the job that holds it."""
    lock = run_record.OutputLock(OUTPUT_DIR)
    try:
        lock.acquire()
    except RuntimeError as e:
        raise InputError(str(e)) from None
    return lock


def rank0_print(msg: str) -> None:
    """Before the process group exists (say() needs it)."""
    if os.environ.get("RANK", "0") == "0":
        print(msg, flush=True)


def check_same_checkpoint(path: Path | None) -> Path | None:
    """Every rank picked its checkpoint from its own view of OUTPUT_DIR. If the views differ (node-local
    folders, stale caches of shared storage), ranks would resume from different steps and desynchronise:
    stop all of them with the same error instead."""
    chosen = [None] * dist.get_world_size()
    dist.all_gather_object(chosen, str(path) if path else None)
    if len(set(chosen)) > 1:
        raise RuntimeError(
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
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(trainer_state["optimizer"])  # also puts the checkpoint's lr, weight_decay back...
    for group, mine in zip(optimizer.param_groups, settings, strict=True):
        group.update(mine)  # ... which this run's own replace
    return trainer_state["progress"]


def current_layout():
    """The memory layout these constants describe, as memory_budget.py names it."""
    import memory_budget

    return memory_budget.Layout(MICRO_BATCH, GRADIENT_CHECKPOINTING, CHECKPOINT_OFFLOAD, CE_CHUNK_TOKENS)


def predicted_peak_gib(peft_model, seq_len: int) -> float:
    """memory_budget.py's prediction of torch.cuda.max_memory_allocated() for this run's settings."""
    import memory_budget

    base = peft_model.get_base_model()
    result = memory_budget.estimate(
        memory_budget.param_shapes_from_model(base),
        base.config.to_dict(),
        current_layout(),
        seq_len=seq_len,
        world_size=dist.get_world_size(),
        lora_r=LORA_R,
        targets=LORA_TARGETS,
        accum=ACCUM_STEPS,
        lora_dropout=LORA_DROPOUT,
        attention=ATTENTION_KERNEL,
    )
    return result["peak_bytes"] / 2**30


def effective_settings() -> dict:
    """Every constant as this run uses it, with where its value came from."""
    return {name: {"value": globals()[name], "source": source} for name, source in SOURCES.items()}


def print_settings(settings: dict) -> None:
    """Once, on rank 0: the constants grouped by source, so what the user and the planner chose stands out."""
    for source in ("env", "planner", "default"):
        chosen = [f"{name}={s['value']}" for name, s in settings.items() if s["source"] == source]
        if chosen:
            print(f"settings ({source}): {' '.join(chosen)}", flush=True)


def this_run_identity(world: int) -> dict:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(MODEL_CONFIG or MODEL_ID).to_dict()
    return run_record.identity(
        {n: globals()[n] for n in run_record.TRAINING}, world, MICRO_BATCH * ACCUM_STEPS, DATA_PATH, config
    )


@contextmanager
def profiled(active: bool, device: torch.device):
    """torch.profiler around one step: the top kernels on rank 0 and a Chrome trace per rank (look for
    NCCL kernels running under the backward compute of the last micro-batch)."""
    if not active:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        yield
    prof.export_chrome_trace(str(Path(OUTPUT_DIR) / f"trace_step{PROFILE_STEP}_rank{dist.get_rank()}.json"))
    say(prof.key_averages().table(sort_by=f"{'cuda' if device.type == 'cuda' else 'cpu'}_time_total", row_limit=30))


def log_metrics(record: dict) -> None:
    """Rank 0: one JSON line in metrics.jsonl, and the numbers to TensorBoard when it is installed."""
    with open(Path(OUTPUT_DIR) / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    writer = tensorboard_writer(OUTPUT_DIR)
    if writer is not None:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                writer.add_scalar(key, value, record["step"])
        writer.flush()


@functools.cache
def tensorboard_writer(output_dir: str):
    """OUTPUT_DIR/tensorboard (tensorboard --logdir OUTPUT_DIR); None without the optional tensorboard package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(Path(output_dir) / "tensorboard"))


def say(msg: str) -> None:
    if dist.get_rank() == 0:
        from tqdm import tqdm

        tqdm.write(msg, file=sys.stdout)


# ----------------------------------------------------------------------------------------------
def main() -> None:
    rank, local_rank, world = rank_info()

    # 1. Checks. Everything that can be wrong with the inputs fails here, identically on every rank and
    #    before the first collective: bad input can never turn into a hang.
    from transformers import AutoTokenizer

    for warning in check_settings():
        rank0_print(warning)
    check_model_source()
    check_writable(OUTPUT_DIR)
    lock = acquire_output_lock() if rank == 0 else None  # one job per OUTPUT_DIR
    plan_settings()
    conversations = load_conversations(DATA_PATH)
    eval_conversations = load_conversations(EVAL_PATH) if EVAL_PATH else None
    n_steps_epoch = steps_per_epoch(len(conversations), world)
    total_steps = EPOCHS * n_steps_epoch if MAX_STEPS <= 0 else min(MAX_STEPS, EPOCHS * n_steps_epoch)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_ID)
    rank0_print(data_summary(tokenizer, conversations, n_steps_epoch * world * MICRO_BATCH * ACCUM_STEPS))
    identity = this_run_identity(world)
    finished = finished_run(identity, total_steps)
    resume_from = find_resume_checkpoint(identity) if finished is None else None
    run_config = {
        "settings": effective_settings(),
        "identity": identity,
        "resumed_from": resume_from and str(resume_from),
    }
    if rank == 0:  # the run's effective settings, printed once and saved with the run (and in every checkpoint)
        print_settings(run_config["settings"])
        (Path(OUTPUT_DIR) / "config.json").write_text(json.dumps(run_config, indent=1, default=str))

    # 2. Model, adapters and gradient checkpointing, all BEFORE the DDP wrap. Same seed on every
    #    rank while adapters are created; seed + rank afterwards (dropout masks differ per rank).
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before anything touches CUDA: no stray context on GPU 0
    torch.manual_seed(SEED)
    peft_model = add_lora(load_model(device))
    torch.manual_seed(SEED + rank)

    # 3. Process group: NCCL on GPUs, gloo on CPU. From here on every failure is reported and bounded.
    init_distributed(device)
    with failures_reported(rank, world, lock) as watchdog:
        # 4. Optimizer, schedule and resume: every rank loads the same checkpoint, so all start identical.
        if already_complete(finished, total_steps, device):
            return
        adapter_params = [p for p in peft_model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(adapter_params, lr=LR, weight_decay=WEIGHT_DECAY, fused=device.type == "cuda")
        progress = {"epoch": 0, "step": 0, "step_in_epoch": 0}
        if (resume_from := check_same_checkpoint(resume_from)) is not None:
            progress = load_checkpoint(resume_from, peft_model, optimizer)
            say(f"resumed from {resume_from} at step {progress['step']}")
        scheduler = lr_schedule(optimizer, total_steps, steps_taken=progress["step"])
        _step.update(current=progress["step"], completed=progress["step"])
        first_step = progress["step"] + 1

        # 5. DDP around the model and its loss: one forward, gradients all-reduced in buckets during backward.
        model = wrap_ddp(peft_model, device)
        collate = PadCollate(tokenizer.pad_token_id, PAD_TO_MULTIPLE)
        dataset = ChatDataset(conversations, tokenizer, MAX_LEN, ASSISTANT_ONLY_LOSS)
        eval_set = (
            ChatDataset(eval_conversations, tokenizer, MAX_LEN, ASSISTANT_ONLY_LOSS) if eval_conversations else None
        )
        n_trainable, n_total = peft_model.get_nb_trainable_parameters()
        say(
            f"world {world} on {device.type} | {n_total:,} params, {n_trainable:,} trainable "
            f"({100 * n_trainable / n_total:.2f}%) | global batch {MICRO_BATCH}x{ACCUM_STEPS}x{world}="
            f"{MICRO_BATCH * ACCUM_STEPS * world} | {total_steps} steps"
        )
        if SAVE_ON_SIGTERM:
            STOP.install(watchdog)  # from here on a preemption saves first (torchrun waits 30 s before SIGKILL)
        log = StepLog(peft_model, total_steps, progress["step"], device)
        model.train()

        # 6. The loop. Each rank reads its own shard (DistributedSampler); an epoch is the same number of
        #    optimizer steps on every rank, so every collective below is entered by every rank.
        while progress["step"] < total_steps:
            epoch = progress["epoch"]
            skip = progress["step_in_epoch"] * ACCUM_STEPS * MICRO_BATCH  # samples this rank already trained on
            batches = iter(
                train_loader(dataset, rank, world, epoch, skip, collate, dataset.lengths if GROUP_BY_LENGTH else None)
            )
            while progress["epoch"] == epoch and progress["step"] < total_steps:
                step = _step["current"] = progress["step"] + 1
                torch.manual_seed(SEED + 1_000_003 * rank + step)  # dropout masks: a function of (seed, rank, step)
                t_data = time.perf_counter()
                micro_batches = [next(batches) for _ in range(ACCUM_STEPS)]
                t0 = synchronized_clock(device)
                with profiled(step == PROFILE_STEP, device):
                    # no_sync for all but the last micro-batch; the token count is all-reduced first
                    loss_sum, counts, stop = forward_backward(model, micro_batches, device)
                # Clip after the all-reduce: every rank holds the same averaged gradients, the same norm.
                grad_norm = float(torch.nn.utils.clip_grad_norm_(adapter_params, GRAD_CLIP or math.inf))
                finite = math.isfinite(loss_sum) and math.isfinite(grad_norm)  # equal on every rank: one decision
                if finite:
                    optimizer.step()
                elif NAN_POLICY == "stop":
                    raise RuntimeError(
                        f"non-finite loss or gradient norm at step {step} (loss sum {loss_sum}, "
                        f"grad norm {grad_norm}); NAN_POLICY=stop"
                    )
                lr = scheduler.get_last_lr()[0]  # the rate this update used
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step_time = synchronized_clock(device) - t0

                progress.update(step=step, step_in_epoch=progress["step_in_epoch"] + 1)
                if progress["step_in_epoch"] == n_steps_epoch:  # epoch end: resume starts the next epoch
                    progress.update(epoch=epoch + 1, step_in_epoch=0)
                _step["completed"] = step
                if step == first_step:  # the ranks are in lockstep now: hangs get the short timeout
                    set_collective_timeout(DIST_TIMEOUT_S, watchdog)
                log.step(step, epoch, loss_sum, counts, grad_norm, lr, finite, step_time, t0 - t_data, micro_batches)
                if DRIFT_CHECK_EVERY and step % DRIFT_CHECK_EVERY == 0:
                    check_replicas_identical(model.module, step)  # an all-gather of every rank's adapter checksum
                if eval_set is not None and EVAL_EVERY and step % EVAL_EVERY == 0:
                    log.eval(step, evaluate(model, eval_set, collate, device))
                if stop and step < total_steps:  # preempted: every rank learnt it in the same all-reduce
                    STOP.at_boundary.set()
                    save_checkpoint(model, optimizer, dict(progress), run_config)
                    say(
                        f"stopped by {STOP.reason or 'another rank'} after step {step}: "
                        f"checkpoint saved; the same command resumes from it"
                    )
                    return
                if progress["epoch"] > epoch or (SAVE_EVERY and step % SAVE_EVERY == 0 and step < total_steps):
                    t_save = time.perf_counter()
                    save_checkpoint(model, optimizer, dict(progress), run_config)  # rank 0 writes
                    say(f"checkpoint step {step} saved in {time.perf_counter() - t_save:.2f}s")
        log.close()

        # 7. Final evaluation, drift check and the adapter (rank 0 writes, everyone waits at a barrier).
        if eval_set is not None and not (EVAL_EVERY and progress["step"] % EVAL_EVERY == 0):  # else just done
            log.eval(progress["step"], evaluate(model, eval_set, collate, device), final=True)
        checksum = check_replicas_identical(model.module, progress["step"])
        path = save_adapter(model, run_config, progress)
        say(f"adapter checksum {checksum} identical on all {world} ranks | saved to {path}")
        say_where_everything_is(path)


@contextmanager
def failures_reported(rank: int, world: int, lock):
    """Around everything after the process group exists: a HangWatchdog for stuck collectives; an InputError
    shuts the rank down cleanly (where it is raised on one rank only, e.g. a chat template that is not
    prefix-stable for one row, the peers' next collective times out with a report); any other failure (a
    timed-out collective, a dead peer, a guard) is reported with where this rank was, and the rank leaves
    without destroy_process_group(), which can block after a failed collective."""
    watchdog = HangWatchdog(rank, world)
    watchdog.start()
    try:
        yield watchdog
    except InputError:
        watchdog.stop()
        leave_process_group()
        raise
    except Exception as e:
        watchdog.stop()
        print(failure_report(e, rank, watchdog), file=sys.stderr, flush=True)
        record_for_torchrun(e)  # after the report: a peer that died first stays torchrun's root cause
        sys.stdout.flush()
        if lock:
            lock.release()
        os._exit(1)  # the loaders' workers die with this process (guards.py)
    finally:
        watchdog.stop()  # also on KeyboardInterrupt and SystemExit
    leave_process_group()


def leave_process_group() -> None:
    """destroy_process_group(), on gloo after a pause. gloo's worker thread frees the last collectives'
    tensors, which takes the GIL; freeing the process group (in DDP's destructor, GIL held) joins that
    thread. Caught once in CI: both waited forever (torch 2.13). The pause lets the thread finish first."""
    if dist.get_backend() == "gloo":
        time.sleep(0.5)
    dist.destroy_process_group()


def failure_report(e: Exception, rank: int, watchdog: HangWatchdog) -> str:
    """What a failed rank prints: one line for an OUTPUT_DIR that cannot be written; else the traceback, the
    collective it is stuck in and the peer that is gone. The cause goes to the peers too, and the first
    cause another rank posted is added here."""
    if line := output_dir_problem(e):  # the user's environment, not a bug: one line says it all
        report = f"[rank {rank}] error: {line} ({step_position()})\n"
    else:
        line = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        report = f"[rank {rank}] failed {step_position()}\n{traceback.format_exc()}"
        if stuck := watchdog.describe_failure():
            report += f"[rank {rank}] stuck in {stuck}\n"
        if "gloo/transport" in line and (gone := watchdog.peers_gone()):  # a peer's connection broke: which?
            line = f"rank(s) {gone} stopped beating: the process is gone"
            report += f"[rank {rank}] {line}\n"
    watchdog.post_failure(line)
    cause = watchdog.first_failure()  # this rank's own, or a peer's that came first
    if cause and not cause.startswith(f"rank {rank} "):
        report += f"[rank {rank}] {cause}\n"
    return report.rstrip()


def output_dir_problem(e: BaseException) -> str | None:
    """The one line for a failure to write OUTPUT_DIR (a save, the metrics, a trace), else None."""
    if isinstance(e, OutputDirError):
        return str(e)
    out = Path(OUTPUT_DIR).resolve()
    if isinstance(e, OSError) and e.filename and out in Path(os.fsdecode(e.filename)).resolve().parents:
        return f"OUTPUT_DIR {out} cannot be written any more{'' if out.is_dir() else ' (it vanished)'}: {e}"
    return None


def synchronized_clock(device: torch.device) -> float:
    """time.perf_counter() once the GPU has finished what was queued (step times measure the work)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def already_complete(finished: str | None, total_steps: int, device: torch.device) -> bool:
    """Whether this run has nothing left to do (finished_run), decided from every rank's view of OUTPUT_DIR at
    once (a rank that returned alone would leave its peers waiting in DDP's first broadcast)."""
    adapter = Path(OUTPUT_DIR) / "adapter"
    (votes,) = all_reduce_sum([float(finished is not None)], device)
    if 0 < votes < dist.get_world_size():
        raise RuntimeError(
            f"ranks disagree whether {adapter} is complete ({votes:.0f} of {dist.get_world_size()} "
            f"see it intact): OUTPUT_DIR must be one shared folder, seen the same by every node"
        )
    if not votes:
        return False
    say(
        f"this run is already complete ({total_steps} of {total_steps} steps): nothing to train{finished}. To "
        f"train again, RESUME='' or another OUTPUT_DIR; to train longer, more EPOCHS with RESUME_ALLOW_CHANGES=1"
    )
    say_where_everything_is(adapter)
    return True


class StepLog:
    """Rank 0's record of each step (metrics.jsonl, TensorBoard, the console and the progress bar), with
    the memory model checked once against the real peak, at step 3 (AdamW state and allocator caches exist)."""

    MEMORY_CHECK_STEP = 3

    def __init__(self, peft_model, total_steps: int, done: int, device: torch.device):
        from tqdm import tqdm

        self.peft_model, self.total_steps, self.device, self.longest = peft_model, total_steps, device, 0
        self.rank0 = dist.get_rank() == 0
        self.bar = tqdm(
            total=total_steps,
            initial=done,
            desc="train",
            dynamic_ncols=True,
            disable=not self.rank0 or not sys.stderr.isatty(),
        )

    def step(self, step, epoch, loss_sum, counts, grad_norm, lr, finite, step_time, data_wait, micro_batches):
        self.bar.update(1)
        self.longest = max(self.longest, *(b["input_ids"].shape[1] for b in micro_batches))
        check_memory = self.device.type == "cuda" and step == self.MEMORY_CHECK_STEP
        if not self.rank0 or not ((LOG_EVERY and step % LOG_EVERY == 0) or step == self.total_steps or check_memory):
            return
        n_targets, n_tokens, n_padded = counts
        record = {
            "step": step,
            "epoch": epoch,
            "loss": loss_sum / max(n_targets, 1.0),
            "grad_norm": grad_norm,
            "lr": lr,
            "skipped": not finite,
            "tokens_per_s": n_tokens / step_time,
            "target_tokens_per_s": n_targets / step_time,
            "step_time_s": step_time,
            "targets": int(n_targets),
            "tokens": int(n_tokens),
            "padding": 1 - n_tokens / n_padded,
            "data_wait_s": data_wait,
        }
        if self.device.type == "cuda":
            record["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
            record["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            if check_memory:
                try:  # a diagnostic: it never stops the training
                    record["predicted_peak_gib"] = predicted_peak_gib(self.peft_model, self.longest)
                except Exception as e:
                    say(f"warning: no memory prediction ({type(e).__name__}: {e})")
        log_metrics(record)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
        say(" | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))

    def eval(self, step: int, result: dict, final: bool = False) -> None:
        if self.rank0:
            log_metrics({"step": step, **result})
        say(
            f"eval | {'final' if final else f'step {step}'} | loss {result['eval_loss']:.4f} | "
            f"ppl {result['eval_ppl']:.2f}"
        )

    def close(self) -> None:
        self.bar.close()


def lr_schedule(optimizer, total_steps: int, steps_taken: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over WARMUP_STEPS in which step 1 already trains (at LR/WARMUP_STEPS), then cosine decay,
    positioned after `steps_taken` steps: a resumed run derives it from its own LR, WARMUP_STEPS and length."""

    def factor(steps_taken: int) -> float:
        if steps_taken < WARMUP_STEPS:
            return (steps_taken + 1) / WARMUP_STEPS
        return 0.5 * (1 + math.cos(math.pi * (steps_taken - WARMUP_STEPS) / max(1, total_steps - WARMUP_STEPS)))

    for group in optimizer.param_groups:
        group["initial_lr"] = LR
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch=steps_taken - 1)


def say_where_everything_is(adapter: Path) -> None:
    out = Path(OUTPUT_DIR)
    say(
        f"adapter: {adapter}   metrics: {out / 'metrics.jsonl'}   checkpoints: {out / 'checkpoints'}   "
        f"settings: {out / 'config.json'}\nload it: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("
        f"{MODEL_ID!r}), {str(adapter)!r})"
    )


def record_for_torchrun(error: BaseException) -> None:
    """torchrun's failure summary then shows this error as the root cause, instead of error_file: <N/A>."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    ErrorHandler().record_exception(error)


def run() -> None:
    """main(), with bad input reported as one line (the same on every rank) and exit code 2."""
    try:
        main()
    except InputError as e:
        print(f"[rank {os.environ.get('RANK', 0)}] error: {e}", file=sys.stderr, flush=True)
        record_for_torchrun(e)
        sys.exit(2)


if __name__ == "__main__":
    run()
