"""Shared fixtures: paths to the embedded default, a bounded multi-process launcher and the backends.

Multi-rank tests run on gloo (CPU, what CI runs) and, where a case is parametrized with BACKENDS, on
NCCL with one GPU per rank: the GPU lane, `python -m pytest -m gpu`, skipped without 2 CUDA devices."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from guards import descendants, kill_tree, proc_stat

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ROOT / "assets" / "tiny-gemma4"
SAMPLE_DATA = ROOT / "assets" / "sample_chat.jsonl"
# Ranks of the multi-rank jobs: 2, or LANE_RANKS (the lane at N ranks: LANE_RANKS=N python -m pytest -m gpu on N
# GPUs; gloo runs it on the CPU too).
RANKS = int(os.environ.get("LANE_RANKS", "2"))
ENOUGH_GPUS = torch.cuda.device_count() >= RANKS
BACKENDS = [
    "gloo",
    pytest.param(
        "nccl", marks=[pytest.mark.gpu, pytest.mark.skipif(not ENOUGH_GPUS, reason=f"needs {RANKS} CUDA devices")]
    ),
]


def launch_env(backend: str = "gloo") -> dict:
    """gloo runs hide the GPUs (the job then picks gloo on CPU); NCCL runs keep them, one per rank."""
    hide = {"CUDA_VISIBLE_DEVICES": ""} if backend == "gloo" else {}
    # PYTHONFAULTHANDLER: a job past its time prints every thread's stack on the SIGABRT of stacks_then_kill
    quiet = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    return {**quiet, "PYTHONFAULTHANDLER": "1", **hide}


def stacks_then_kill(*launchers: subprocess.Popen) -> list[str]:
    """Launches past their time: every launcher and every process below them (ranks, loader workers) is paused
    first, so that none moves on (a launcher would end its ranks as the first one dies, a rank would time out on
    a paused store or find its peer gone). Where py-spy is installed, each process of every launch runs again in
    turn for `py-spy dump --native` (the C frames too: which lock a thread waits on; SPY_S in all). Then each,
    deepest first (a rank's end kills its workers), prints its threads' Python stacks: faulthandler (launch_env
    turns it on) takes a SIGABRT sent while it is paused, before it runs one more line of Python. Then every tree
    is killed. Returns, for each launcher, its report."""
    running = [proc for proc in launchers if proc.poll() is None]
    trees = {proc.pid: [proc.pid, *descendants(proc.pid)] for proc in running}
    below = {proc.pid: list(reversed(trees.get(proc.pid, [])[1:])) for proc in launchers}
    for pid in (pid for tree in trees.values() for pid in tree):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    beside_python = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # a venv not activated
    spy, native, deadline = shutil.which("py-spy", path=beside_python), {}, time.monotonic() + SPY_S
    for pid in (pid for pids in below.values() for pid in pids) if spy else ():
        left = deadline - time.monotonic()
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            os.kill(pid, signal.SIGCONT)  # py-spy cannot attach to a process paused by SIGSTOP
            dump = subprocess.run(
                [spy, "dump", "--native", "-p", str(pid)], capture_output=True, text=True, timeout=left
            )
            native[pid] = f"--- py-spy, pid {pid}:\n{dump.stdout}{dump.stderr}"
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        if time.monotonic() > deadline:
            break
    reports = []
    for proc in launchers:
        order = []
        for pid in below[proc.pid]:
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[-60:]
                os.kill(pid, signal.SIGABRT)
                os.kill(pid, signal.SIGCONT)
                order.append(f"pid {pid} ({command})")
                wait_until(lambda pid=pid: not alive(pid), 10)  # one process's stacks at a time, written whole
        dumps = "".join(f"\n{native[pid]}" for pid in below[proc.pid] if pid in native)
        reports.append("stacks, in this order: " + "; ".join(order) + dumps)
    for proc in launchers:
        kill_tree(proc)
    return reports


SPY_S = 90  # py-spy's time for every process of a hung test's launches together


@dataclass
class Launch:
    returncode: int
    output: str  # stdout and stderr of every rank, interleaved

    def errors(self) -> list[tuple[int, str]]:
        """Every `[rank N] error: ...` line as (N, its message) (a rank torchrun stopped first has none)."""
        return [(int(m[1]), m[2]) for m in re.finditer(r"^\[rank (\d+)\] error: (.*)$", self.output, re.M)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout: float = 5.0) -> bool:
    """Poll `condition` until it holds (True) or `timeout` s pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie (its parent, maybe paused, has not reaped it)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in "ZX"


def torchrun(
    script,
    *args,
    nproc: int = RANKS,
    env: dict | None = None,
    timeout: float = 180,
    extra_torchrun_args: tuple = (),
    backend: str = "gloo",
) -> Launch:
    """Run `torchrun --nproc_per_node=nproc script args` on `backend` with a hard time bound.

    A job that outlives `timeout` is killed with its whole process group and the test fails with
    the output so far: a hang becomes an error, never a stalled CI.
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--rdzv-backend=c10d",
        *extra_torchrun_args,
        str(script),
        *map(str, args),
    ]
    full_env = {**os.environ, **launch_env(backend), **(env or {})}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    # read all along by a thread: a pipe nobody read while stacks_then_kill runs would fill, and block the very
    # processes printing their stacks
    chunks, deadline = [], time.monotonic() + timeout
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read1(65536), b"")), daemon=True)
    reader.start()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        (report,) = stacks_then_kill(proc)
        reader.join(10)
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout}s (hang?); {report}\n{joined(chunks)[-12000:]}")
    reader.join(max(deadline - time.monotonic(), 5))  # the output ends when every process holding it has
    if reader.is_alive():
        pytest.fail(f"{' '.join(cmd)}: a process of the job outlived its launcher\n{joined(chunks)[-12000:]}")
    return Launch(proc.returncode, joined(chunks))


def joined(chunks: list[bytes]) -> str:
    return b"".join(list(chunks)).decode(errors="replace")


def usage_error(main, argv: list, capsys) -> str:
    """What a command-line tool's `main(argv)` prints when argparse refuses `argv`: exit 2, no traceback."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    return err


def writes_to(monkeypatch, stream: str) -> list[str]:
    """Replace sys.<stream> with a recorder: the list fills with each non-empty write() call's text, so a
    test can tell one write of a line from its text and newline written apart."""
    writes = []

    class Recorder:
        def write(self, text):
            if text:
                writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, stream, Recorder())
    return writes


def nonzero_lora_b(model):
    """PEFT starts every LoRA B at zero, which leaves A without a gradient: random B (seeded, the same on every
    rank) so that every adapter weight gets one. Returns the model."""
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.02)
    return model


def cpu_config(**overrides):
    """train_ddp's settings as a CPU run plans them (ATTENTION_KERNEL=auto resolves to sdpa), with `overrides`."""
    import train_ddp as T

    return T.Config(ATTENTION_KERNEL="sdpa", **overrides)


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_MODEL)


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    return TINY_MODEL


@pytest.fixture(scope="session")
def sample_data_path() -> Path:
    return SAMPLE_DATA


def project_files() -> dict[str, float]:
    """Every file of the checkout with its modification time, but for what Python and pytest make."""
    skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
    return {
        str(p.relative_to(ROOT)): p.stat().st_mtime
        for p in ROOT.rglob("*")
        if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
    }


@pytest.fixture(scope="session", autouse=True)
def tests_write_only_to_their_temporary_folders():
    """A user's out/ from the README's first command (or any file of the checkout) survives the tests."""
    before = project_files()
    yield
    after = project_files()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"tests wrote into the checkout: {changed[:10]}"
