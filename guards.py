"""Guards around the training job: what keeps a failure from becoming a hang or a lost run.

- InputError / OutputDirError / JobStopped: bad input, an OUTPUT_DIR that cannot be written, a guard's stop:
  expected failures, each one line, not a traceback.
- FailuresBeforeGroup: a rank that fails before the process group forms ends the ranks that wait for it.
- HangWatchdog: a collective stuck past the timeout ends the rank with a report (on NCCL too, where the
  wait is on the GPU); it beats in the rendezvous store, so peers can tell a dead process from a slow one.
- GracefulStop: SIGTERM, Ctrl-C, SIGHUP or a lost launcher finish the step, checkpoint and exit 0.
- failures_reported(): around everything after the process group exists: any failure is reported with the
  step, the stuck collective and the first cause any rank posted; the rank then leaves, bounded.
- check_replicas_identical(): the drift check, an all-gather of every rank's adapter checksum.
- DataLoader workers that live and die with their rank; a launched job ended whole (kill_tree).

At preemption torchrun (and a cluster's scheduler) sends SIGTERM to the rank's whole process group,
its DataLoader workers included. A worker killed then fails the step that the rank is finishing for
its checkpoint (the loader reports a dead worker). But a worker that ignores SIGTERM outright is
never stopped either: at the rank's exit, multiprocessing stops its daemonic children with SIGTERM
and then waits for them, forever (the rank hangs after its last line). So a worker takes its orders
from its rank alone:

- SIGTERM ends it only when its rank sent it: the DataLoader's own shutdown and the interpreter's
  exit do; torchrun's and the cluster's are ignored (the rank handles those, and ends its workers).
- it dies with its rank (Linux PR_SET_PDEATHSIG), which may end without any cleanup (os._exit after
  a failure, SIGKILL);
- Ctrl-C at the terminal reaches the whole foreground group, and torchrun passes a closed terminal's SIGHUP
  to the rank's group: the rank handles both, the worker ignores them.
"""

import contextlib
import ctypes
import errno
import faulthandler
import functools
import hashlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from logs import output_kept

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class InputError(Exception):
    """Bad configuration or data. Raised identically on every rank before any collective."""


class GroupNotFormed(InputError):
    """The process group did not form: a rank stopped before joining (its line, where it posted one), the store's
    host went away, or the ranks were started with addresses that do not meet."""


class OutputDirError(RuntimeError):
    """OUTPUT_DIR could not be written (full, read-only, vanished): reported in one line, not a traceback."""


class JobStopped(RuntimeError):
    """A guard stopped the job on purpose (replica drift, NAN_POLICY=stop, ranks that disagree on OUTPUT_DIR):
    an expected failure, reported in one line, not a traceback."""


LOADER_TIMED_OUT = re.compile(r"DataLoader timed out after (\d+) seconds")  # torch's message, on a loader's timeout


def one_line(e: BaseException, output_dir: str, memory_target_gib: float = 0.0) -> str | None:
    """The one line for an expected failure: a guard's stop, a GPU out of memory, a failure to use `output_dir`
    (a save, the metrics, a trace), a full disk, a data worker killed (host memory) or stuck; else None (a bug or
    a broken peer: the traceback helps)."""
    if isinstance(e, (OutputDirError, JobStopped)):
        return str(e)
    if isinstance(e, torch.OutOfMemoryError):
        return out_of_memory(str(e), memory_target_gib)
    out = Path(output_dir).resolve()
    if isinstance(e, OSError) and e.filename and out in Path(os.fsdecode(e.filename)).resolve().parents:
        return f"OUTPUT_DIR {out} cannot be read or written any more{'' if out.is_dir() else ' (it vanished)'}: {e}"
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:  # unnamed (TensorBoard's writer): most likely OUTPUT_DIR
        return f"no space left on a device (df -h {out} shows OUTPUT_DIR's): {e}"
    # torch raises "exited unexpectedly" from the worker's own error when the rank was waiting for a batch
    causes = " | ".join(str(c) for c in (e, e.__cause__) if isinstance(c, RuntimeError))
    if killed := re.search(r"DataLoader worker \(pid \d+\) is killed by signal: Killed", causes):
        return (
            f"a data loader worker was killed ({killed[0]}; SIGKILL, most often the kernel's out-of-memory "
            f"killer): lower NUM_WORKERS, or give the job more host memory"
        )
    if waited := LOADER_TIMED_OUT.search(causes):
        return (
            f"no micro-batch from this rank's data loader workers in {waited[1]} s (DIST_TIMEOUT_S): a worker is stuck "
            "(their stacks are above: a lock held at the fork, or a row's reading, tokenizing or collating), or ended"
        )
    return None


def error_line(e: BaseException) -> str:
    """A failure in one line: bad input's message, a GPU out of memory with what to do, else its type and first line."""
    if isinstance(e, InputError):
        return str(e)
    if isinstance(e, torch.OutOfMemoryError):
        return out_of_memory(str(e))
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def gib(amount: str) -> float:
    """torch's '1.05 GiB' / '512.00 MiB' / '3.19 KiB' / '20 bytes' in GiB."""
    number, unit = amount.split()
    return float(number) / 1024 ** {"GiB": 0, "MiB": 1, "KiB": 2}.get(unit, 3)


def out_of_memory(message: str, memory_target_gib: float = 0.0) -> str:
    """What to do when the GPU ran out of memory (torch's `message` says what it tried on how large a card): a
    memory target for the planner, 93% of the card (the README's H200 row: 130 of 139.8 GiB), or a tenth below
    the MEMORY_TARGET_GIB the run had (its layout then is the planner's: MICRO_BATCH is not yours to lower).
    Memory other processes hold (the card's used memory beyond this process's: a previous run left behind, a
    second job on the same GPU) is named and left out of the target."""
    card = re.search(
        r"Tried to allocate ([\d.]+ \w+)\. GPU \d+ has a total capacity of ([\d.]+) GiB"
        r"(?: of which ([\d.]+ \w+) is free)?",
        message,
    )
    in_use = re.search(r"this process has ([\d.]+ \w+) memory in use", message)
    others = float(card[2]) - gib(card[3]) - gib(in_use[1]) if card and card[3] and in_use else 0.0
    others = others if others >= 1 else 0.0  # below a GiB: rounding in torch's figures
    if card:
        said = f"tried to allocate {card[1]} on a {card[2]} GiB GPU" + (f" with {in_use[1]} in use" if in_use else "")
        said += f"; other processes hold {others:.1f} GiB of it (nvidia-smi names them)" if others else ""
    else:
        said = message.splitlines()[0][:120]
    room = (float(card[2]) - others) * 0.93 if card else math.inf  # what this process may plan for
    end_them = ", or end the other processes" if others else ""
    if memory_target_gib:
        return (
            f"out of GPU memory ({said}): MEMORY_TARGET_GIB={memory_target_gib:g} was not low enough; "
            f"MEMORY_TARGET_GIB={int(min(memory_target_gib * 0.9, room))} plans a smaller layout, or lower "
            f"MAX_LEN{end_them}"
        )
    return (
        f"out of GPU memory ({said}): MEMORY_TARGET_GIB={int(room) if card else '<the GPU GiB less 7%>'} makes the "
        f"planner choose a layout predicted to fit, or lower MICRO_BATCH or MAX_LEN{end_them}; python "
        f"memory_budget.py MODEL_ID shows what each part needs"
    )


def record_for_torchrun(error: BaseException, line: str | None = None) -> None:
    """torchrun's failure summary then shows this error as the root cause, instead of error_file: <N/A>: for an
    expected failure (bad input, a guard's stop, OUTPUT_DIR, a GPU out of memory) the `line` it is told in, else
    the traceback."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    if line and os.environ.get("TORCHELASTIC_ERROR_FILE"):
        line = f"{type(error).__name__}: {line}"
        info = {"py_callstack": line, "timestamp": str(int(time.time()))}
        Path(os.environ["TORCHELASTIC_ERROR_FILE"]).write_text(
            json.dumps({"message": {"message": line, "extraInfo": info}})
        )
    else:
        ErrorHandler().record_exception(error)


def launch_store(name: str) -> dist.PrefixStore:
    """A client of the store at MASTER_ADDR:MASTER_PORT (torchrun's agent's, or rank 0's once the group formed),
    its keys under `name` and this launch attempt (a torchrun restart starts afresh)."""
    attempt = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=10)
    )
    return dist.PrefixStore(f"{name}/{attempt}/", client)


# ----------------------------------------------------------------------------------------------
# A rank that fails before the process group forms
class FailuresBeforeGroup:
    """Around everything before the process group forms. The ranks wait for each other there (init_process_group,
    up to DIST_INIT_TIMEOUT_S): one that fails first (its node's copy of the data, a model or OUTPUT_DIR missing
    on its node) would leave the others waiting that long. Under torchrun, whose agent serves its store before
    the ranks start (TORCHELASTIC_USE_AGENT_STORE), the failing rank posts its line there; a waiting rank ends
    with it (exit 2) GRACE_S after reading it, time for a rank with the same bad input to report its own line.
    A store that stops answering for GRACE_S (its node's agent exited) ends the waiting ranks too. A rank that
    read a line reports it, the cause, also when its own group fails to form first, or when its agent, losing the
    store with the failed node, stops it with SIGTERM (GracefulStop asks end_with_peer_line). Not watched:
    with --max_restarts (torchrun restarts every node's ranks itself, and keys would outlive their round), and
    where rank 0 opens the store only as the group forms; there the wait stays DIST_INIT_TIMEOUT_S."""

    POLL_S, GRACE_S = 1.0, 10.0

    def __init__(self, rank: int, world: int, stop: "GracefulStop"):
        self.rank, self.world, self.stop, self.ended, self.lock = rank, world, stop, threading.Event(), threading.Lock()
        self.reading = threading.Lock()  # the watch and __exit__ may both read: the read is counted once
        self.store, self.seen = None, None  # seen: the first line a peer posted, once read
        restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
        if world > 1 and not restarts and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            with contextlib.suppress(RuntimeError, OSError):  # unreachable: init_process_group says so, in one line
                self.store = launch_store("failures-before-group")
                threading.Thread(target=self._watch, daemon=True, name="failures-before-group").start()
                stop.before_group = self

    def __enter__(self) -> "FailuresBeforeGroup":
        return self

    def __exit__(self, kind, error, tb) -> None:
        with self.lock:  # the watch has ended this rank already, or never will
            ended = self.ended.is_set()
            self.ended.set()
        self.stop.before_group = None
        if not isinstance(error, Exception) or self.store is None or ended:
            return
        if isinstance(error, GroupNotFormed):  # a peer's failure is the cause: read it now if the watch had not
            with contextlib.suppress(RuntimeError, OSError):
                self._read_peer_line()
            if self.seen:
                raise GroupNotFormed(self.seen) from None
        line = f"rank {self.rank} failed before the group formed: {error_line(error)}"
        with contextlib.suppress(RuntimeError, OSError):
            self.store.compare_set("1", "", line)  # the line first (the first one posted stays), then the count
            self.store.add("count", 1)
            # Linger until every rank posted or read a line (up to GRACE_S: a rank busy in C, starting CUDA, may
            # not poll for seconds): this node's agent may serve the store, and it ends with this rank.
            deadline = time.monotonic() + self.GRACE_S
            while self.store.add("count", 0) + self.store.add("read", 0) < self.world and time.monotonic() < deadline:
                time.sleep(0.1)

    def _watch(self) -> None:
        since, failing_since = None, None  # when a peer's line was read; since when the store is silent
        while not self.ended.wait(self.POLL_S):
            try:
                self._read_peer_line()
                failing_since = None
            except (RuntimeError, OSError):  # the agent serving the store exited, or a blip: GRACE_S tells
                failing_since = failing_since or time.monotonic()
            since = since or (time.monotonic() if self.seen else None)
            gone = failing_since is not None and time.monotonic() - failing_since > self.GRACE_S
            line = self.seen if self.seen and (gone or time.monotonic() - since > self.GRACE_S) else None
            if gone and not line:
                where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
                line = f"the rendezvous store at {where} stopped answering before the group formed (the torchrun "
                line += "agent serving it exited: its log says why)"
            if line:
                self.end_with(line)
                return

    def _read_peer_line(self) -> None:
        """Read the first line a peer posted, once, and count the read: the failed rank waits for every rank's
        post or read."""
        with self.reading:
            if self.seen is None and self.store.add("count", 0):
                self.seen = self.store.get("1").decode()
                self.store.add("read", 1)

    def end_with_peer_line(self) -> None:
        """End this rank with the line a peer posted, if one was read."""
        if self.seen:
            self.end_with(self.seen)

    def end_with(self, line: str) -> None:
        """End this rank (exit 2) with `line`, unless the group formed or the rank ended meanwhile."""
        with self.lock:
            if not self.ended.is_set():
                to_stderr(f"[rank {self.rank}] error: {line}")
                record_for_torchrun(GroupNotFormed(line), line)
                self.stop.leave(2)


# ----------------------------------------------------------------------------------------------
# Stuck collectives, dead peers, a lost launcher
class StepPosition:
    """Where the training loop is, for every report: the optimizer step under way and the last completed one."""

    def __init__(self):
        self.current = self.completed = 0

    def __str__(self) -> str:
        step, done = self.current, self.completed
        if step == done:  # between steps: the throwaway forward before step 1 (settle_buckets), an evaluation, a save
            return f"after optimizer step {done}; last completed step: {done}" if done else "before optimizer step 1"
        return f"in optimizer step {step}; last completed step: {done}"


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
    peers can tell that this process still lives. When torchrun's agent (this rank's parent) exits, or the
    store stops answering (its host is gone: the agent; rank 0 under TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1),
    `stop` is asked to end the job after this step, and the store is not asked again (each failed call logs
    a page of C++ frames; the parent is looked at first, so a node's own agent costs none).
    """

    def __init__(self, rank: int, world: int, timeout_s: float, stop: "GracefulStop"):
        super().__init__(daemon=True, name="hang-watchdog")
        self.rank, self.world, self.timeout_s, self.graceful = rank, world, timeout_s, stop
        self.position = StepPosition()
        self.grace_s = 0 if torch.cuda.is_available() else 5
        self.store = launch_store("hang-watchdog")
        self.store_gone = None  # how the store's host was found gone
        self.launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None  # torchrun's agent
        # whose process serves the store at MASTER_ADDR:MASTER_PORT: a torchrun agent (maybe on another node, this
        # rank's own launcher living on), or rank 0 (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, or no torchrun)
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        self.store_host = f"the launcher serving the rendezvous store at {where}" if agent else "rank 0"
        self.stopped = threading.Event()
        self.reporting = threading.Event()  # the main thread reports a failure: beat on, but leave the exit to it
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

    def ask_store(self, question, default=None):
        """question(store), or `default` once the store has not answered: its host is gone for good."""
        if self.store_gone is None:
            try:
                return question(self.store)
            except (RuntimeError, OSError) as e:
                self.store_gone = f"the rendezvous store it holds does not answer: {type(e).__name__}"
        return default

    def run(self) -> None:
        loss_reported = False
        while not self.stopped.wait(2.0):
            pending, entered = self.state()
            if self.launcher is not None and os.getppid() != self.launcher and self.store_gone is None:
                self.store_gone = f"its process {self.launcher} exited"  # the store it may hold: not asked again
                self.store_host = "the launcher"
            self.ask_store(lambda store: store.add(f"beats/{self.rank}", 1))
            if entered != self.posted:  # (once the store is gone, nothing is posted again)
                self.ask_store(lambda store, count=str(entered): store.set(f"entered/{self.rank}", count))
                self.posted = entered
            if self.store_gone and not loss_reported:
                loss_reported = True
                self.graceful.request(f"the loss of {self.store_host}")
                self.report(
                    f"{self.store_host} is gone ({self.store_gone}): stopping after this step ({self.position})"
                )
            stuck_s = (time.time_ns() - pending[0]["time_created_ns"]) / 1e9 if pending else 0
            if stuck_s > self.timeout_s + self.grace_s and not self.reporting.is_set():
                main = sys._current_frames().get(threading.main_thread().ident)
                here = Path(__file__).parent  # the project's own frames: where the loop waits
                calls = [
                    f"{f.name} (line {f.lineno})"
                    for f in traceback.extract_stack(main)
                    if Path(f.filename).parent == here
                ]
                report = f"collective timeout {self.position}: {self.describe(pending[0])}"
                cause = self.first_failure()
                self.report(
                    f"{report}\n[rank {self.rank}] main thread: {' -> '.join(calls)}"
                    + (f"\n[rank {self.rank}] {cause}" if cause else "")
                )
                record_for_torchrun(TimeoutError(report))
                self.graceful.leave(1)  # nothing else can unblock a main thread that waits on the GPU

    def report(self, text: str) -> None:
        to_stderr(f"[rank {self.rank}] {text}")

    def post_failure(self, line: str) -> None:
        """Tell the peers why this rank is ending (they print it: the root cause appears on every rank)."""
        self.ask_store(
            lambda store: store.set(f"failure/{store.add('failures', 1)}", f"rank {self.rank} failed: {line}")
        )

    def post_stop(self, reason: str) -> None:
        """Tell the peers why this rank asks the job to stop: they learn only the flag, in the step's all-reduce.
        Numbered as post_failure's, so reading them costs a call per stop, not per rank."""
        self.ask_store(lambda store: store.set(f"stop/{store.add('stops', 1)}", f"{reason}\t{self.rank}"))

    def stops_posted(self) -> str | None:
        """Who asked the job to stop, as the ranks posted it ("SIGTERM on rank 1"); None if nobody could."""
        posted = self.ask_store(
            lambda store: [store.get(f"stop/{i}").decode() for i in range(1, store.add("stops", 0) + 1)], []
        )
        ranks = {}
        for why, rank in (p.split("\t") for p in posted):
            ranks.setdefault(why, []).append(rank)
        return "; ".join(f"{why} on rank{'s' * (len(rs) > 1)} {', '.join(rs)}" for why, rs in ranks.items()) or None

    def first_failure(self) -> str:
        """The first failure any rank posted ("" if none did): what the others' errors follow from."""
        return self.ask_store(lambda store: store.get("failure/1").decode() if store.add("failures", 0) else "", "")

    def heartbeats(self) -> dict[int, int]:
        """Every rank's beat count: one that stops growing belongs to a process that is gone. ({} when the store
        does not answer: its host is gone, and with it what tells a dead peer.)"""
        return self.ask_store(lambda store: {r: store.add(f"beats/{r}", 0) for r in range(self.world)}, {})

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
        posted = self.ask_store(
            lambda store: {
                r: int(store.get(f"entered/{r}")) for r in range(self.world) if store.check([f"entered/{r}"])
            }
        )
        if posted is None:
            return f"unknown ({self.store_host} is gone: {self.store_gone})"
        return [r for r in range(self.world) if posted.get(r, 0) < seq]

    def describe(self, e: dict) -> str:
        """One collective, the ranks that never entered it and where this rank's flight recorder is."""
        seq, age = e["collective_seq_id"], (time.time_ns() - e["time_created_ns"]) / 1e9
        self.ask_store(lambda store: store.set(f"entered/{self.rank}", str(self.state()[1])))  # this rank's, fresh
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


def stop_asked(stop: "GracefulStop | None") -> bool:
    """Whether this rank was asked to stop (no GracefulStop, as in benchmarks and tests: never)."""
    return stop is not None and stop.reason is not None


class GracefulStop:
    """Preemption (SIGTERM, what clusters and torchrun send), Ctrl-C, Ctrl-\\ (SIGQUIT), a closed terminal (SIGHUP;
    left alone where it is ignored, as under nohup; torchrun passes all four on) or a lost launcher (HangWatchdog):
    every rank finishes its step (all learn of it in that step's last all-reduce), rank 0 checkpoints, all exit 0.

    A Python signal handler runs only when the main thread returns to Python, which a rank blocked in
    a collective (on NCCL, on the GPU) never does. So the signal is read from the interpreter's wakeup
    pipe by a thread of its own. torchrun also sends SIGTERM to the survivors when a worker died; they
    wait on the dead peer and never reach the end of the step: a signalled rank checks every 5 s, and
    a peer that stopped beating (HangWatchdog.heartbeats), or 25 s without a step boundary (torchrun
    SIGKILLs at 30 s), ends it without a checkpoint. A second Ctrl-C (or a Ctrl-\\) stops at once; repeated SIGTERMs
    (a cluster signals every process, torchrun its workers again) change nothing. Under torchrun the
    workers never see the terminal's Ctrl-C (they run in their own session): torchrun passes it on.
    Until arm() (before the process group forms, or always with SAVE_ON_SIGTERM=0) these signals end the
    rank at once: a rank blocked in C++ (forming the process group, waiting for a late peer) would see
    Python's KeyboardInterrupt only when torchrun SIGKILLs it, 30 s later. Every exit here releases the
    OUTPUT_DIR lock (os._exit skips atexit), so a rerun on another host need not wait for it to go stale.
    """

    GRACE_S, CHECK_S = 25.0, 5.0

    def __init__(self):
        self.signal, self.requested, self.watchdog, self.at_boundary = None, None, None, threading.Event()
        self.rank, self.lock, self.handled, self.wakeup = None, None, [], -1  # set by install()
        self.before_group = None  # the FailuresBeforeGroup watching until the group forms

    @property
    def reason(self) -> str | None:
        """Why the job stops at the end of this step (None: it does not)."""
        return self.signal.name if self.signal else self.requested

    @property
    def by(self) -> str:
        """Who stopped the job: this rank's own reason, else what the peers posted (HangWatchdog.stops_posted)."""
        return self.reason or (self.watchdog and self.watchdog.stops_posted()) or "another rank"

    def request(self, reason: str) -> None:
        """Stop at the end of this step with a checkpoint, as on SIGTERM (every rank learns it in the step's
        last all-reduce)."""
        self.requested = self.requested or reason

    def install(self, rank: int, lock=None) -> None:
        """From here on SIGTERM, SIGINT, SIGQUIT and SIGHUP (unless ignored, as under nohup) are this object's; each
        ends the rank at once until arm(). `lock`: rank 0's OUTPUT_DIR lock, released on every exit here."""
        self.rank, self.lock = rank, lock
        read_end, self.wakeup = os.pipe()
        os.set_blocking(self.wakeup, False)
        self.handled = [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT] + [signal.SIGHUP] * (
            signal.getsignal(signal.SIGHUP) != signal.SIG_IGN
        )
        threading.Thread(target=self._watch, args=(read_end,), daemon=True, name="graceful-stop").start()
        self._take_signals()

    def _take_signals(self) -> None:
        # the pipe first: a signal between the two steps would otherwise run a handler that does nothing
        signal.set_wakeup_fd(self.wakeup, warn_on_full_buffer=False)  # written by the C handler, at once
        for sig in self.handled:
            signal.signal(sig, lambda signum, frame: None)  # the work happens in _watch

    def arm(self, watchdog: HangWatchdog) -> None:
        """From here on a stop signal finishes the step and checkpoints. The signals are taken again: a library
        loaded since install() may have set its own handler or wakeup pipe."""
        self.watchdog = watchdog
        self._take_signals()

    def leave(self, code: int) -> None:
        """End the rank now (os._exit), releasing the OUTPUT_DIR lock first: os._exit skips atexit."""
        if self.lock:
            self.lock.release()
        os._exit(code)

    def _watch(self, read_end: int) -> None:
        while True:
            signum = os.read(read_end, 1)[0]  # every signal with a Python handler (DataLoader's SIGCHLD too)
            if signum not in self.handled:
                continue
            if self.watchdog is None:
                if self.before_group:  # a peer failed before the group formed, its agent then stops this one
                    self.before_group.end_with_peer_line()
                to_stderr(f"[rank {self.rank}] {signal.Signals(signum).name}: exiting at once, without a checkpoint")
                self.leave(128 + signum)
            if self.signal is None:
                self.signal = signal.Signals(signum)
                threading.Thread(target=self._exit_if_stuck, daemon=True).start()
                self.watchdog.post_stop(self.signal.name)  # after: a store that hangs must not delay the stop
            elif signum in (signal.SIGINT, signal.SIGQUIT):  # the user's "now": a second Ctrl-C, or Ctrl-\ (SIGQUIT)
                what = "a second Ctrl-C" if signum == signal.SIGINT else "Ctrl-\\ after a stop"
                self.watchdog.report(f"{what}: exiting at once, without a checkpoint")
                self.leave(128 + signum)

    def _exit_if_stuck(self) -> None:
        start, before = time.monotonic(), self.watchdog.heartbeats()
        while not self.at_boundary.wait(self.CHECK_S):
            now = self.watchdog.heartbeats()
            gone = self.watchdog.stopped_beating(before, now)
            if gone or time.monotonic() - start > self.GRACE_S:
                why = f"rank(s) {gone} stopped beating" if gone else f"no step boundary within {self.GRACE_S:.0f} s"
                cause = self.watchdog.first_failure()
                self.watchdog.report(
                    f"{self.signal.name}: {why} ({self.watchdog.position}); exiting without a checkpoint"
                    + (f"\n[rank {self.watchdog.rank}] {cause}" if cause else "")
                )
                self.leave(128 + self.signal.value)
            before = now


def to_stderr(text: str) -> None:
    """`text` and its newline in ONE write: the ranks share torchrun's pipe, and print() writes the newline
    apart, so a peer's line could land in the middle of this one."""
    with output_kept(sys.stderr):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


@contextlib.contextmanager
def failures_reported(watchdog: HangWatchdog, lock, output_dir: str, memory_target_gib: float = 0.0):
    """Around everything after the process group exists, with `watchdog` running for stuck collectives: an
    InputError shuts the rank down cleanly (where it is raised on one rank only, e.g. a chat template that is
    not prefix-stable for one row, the peers' next collective times out with a report); any other failure (a
    timed-out collective, a dead peer, a guard) is reported with where this rank was, and the rank leaves
    without destroy_process_group(), which can block after a failed collective."""
    watchdog.start()
    try:
        yield watchdog
    except InputError:
        watchdog.stop()
        leave_process_group()
        raise
    except Exception as e:
        # beating on while reporting: a peer that fails at the same moment (both waited in collectives that
        # do not match) must not read this rank as gone
        watchdog.reporting.set()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # DataLoader's handler raises again as more workers end

        line = one_line(e, output_dir, memory_target_gib)  # expected, not a bug: one line says it all
        to_stderr(failure_report(e, watchdog, line))
        # torchrun's summary, after the report: a peer that died first stays the cause
        record_for_torchrun(e, line and f"{line} ({watchdog.position})")
        sys.stdout.flush()
        if lock:
            lock.release()
        os._exit(1)  # the loaders' workers die with this process (bind_worker_to_rank)
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


def failure_report(e: Exception, watchdog: HangWatchdog, line: str | None) -> str:
    """What a failed rank prints: for an expected failure its one `line` (one_line); else the traceback, the
    collective it is stuck in and the peer that is gone. The cause goes to the peers too, and the first
    cause another rank posted is added here."""
    rank = watchdog.rank
    if line:
        report = f"[rank {rank}] error: {line} ({watchdog.position})\n"
    else:
        line = error_line(e)
        report = f"[rank {rank}] failed {watchdog.position}\n{traceback.format_exc()}"
        if stuck := watchdog.describe_failure():
            report += f"[rank {rank}] stuck in {stuck}\n"
        if "gloo/transport" in line and (gone := watchdog.peers_gone()):  # a peer's connection broke: which?
            line = f"rank(s) {gone} stopped beating: the process is gone or frozen"
            report += f"[rank {rank}] {line}\n"
    watchdog.post_failure(line)
    cause = watchdog.first_failure()  # this rank's own, or a peer's that came first
    if cause and not cause.startswith(f"rank {rank} "):
        report += f"[rank {rank}] {cause}\n"
    return report.rstrip()


# ----------------------------------------------------------------------------------------------
# Replica drift: every rank must hold bit-identical adapters
def adapter_checksum(model) -> str:
    """SHA-256 of every trainable tensor's bytes, in name order: equal only if bit-identical."""
    h = hashlib.sha256()
    for name, p in sorted((n, p) for n, p in model.named_parameters() if p.requires_grad):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


# Identity entries that are an input's content, by the setting that names it (a path that may differ by rank: a
# node-local copy). One that differs is a copy that differs, not a setting: every rank may have the same environment.
CONTENT_OF = {
    "data_sha256": (("DATA_PATH",), "DATA_PATH's content differs", "the same file"),
    "eval_sha256": (("EVAL_PATH",), "EVAL_PATH's content differs", "the same file"),
    "model_weights_sha256": (("MODEL_ID",), "MODEL_ID's weights differ", "the same model files"),
    "tokenizer_sha256": (("MODEL_ID",), "MODEL_ID's tokenizer differs", "the same model files and transformers"),
    "model_config_sha256": (
        ("MODEL_CONFIG", "MODEL_ID"),  # the first one set
        "the model's config differs",
        "the same model files and transformers",
    ),
}


def check_same_settings(settings: dict, identity: dict, may_differ: tuple[str, ...], output_lock: dict | None) -> None:
    """The job's first collective: every rank's settings ({name: {"value", "source"}}) and run identity (data
    and model by content) all-gathered and compared, the same error on every rank if they differ. torchrun
    passes one environment to all ranks, but a per-node export or a wrapper can give one rank another
    MICRO_BATCH (a hang at the first collective that differs), LR or data (replicas that silently diverge).
    Those named in `may_differ` are left out (paths to node-local copies, whose content the identity holds).
    `output_lock` is what this rank reads of the lock rank 0 took in OUTPUT_DIR before the group formed: a rank
    that reads another (or none) writes, and would resume, in a folder rank 0 never sees."""
    mine = {
        "settings": {name: s["value"] for name, s in settings.items() if name not in may_differ},
        "identity": identity,
        "paths": {name: settings[name]["value"] for name in may_differ if name in settings},
        "host": socket.gethostname(),
        "output_dir": os.path.abspath(settings["OUTPUT_DIR"]["value"]),
        "output_lock": output_lock,
    }
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if problems := differences_between_ranks(every):
        raise InputError("; ".join(problems))


def differences_between_ranks(every: list[dict]) -> list[str]:
    """What differs between the ranks' views (check_same_settings, by rank), each with what to do: settings
    (another environment), inputs' content (node-local copies), OUTPUT_DIR (node-local folders)."""
    problems = []
    values = [
        {**view["settings"], **{k: v for k, v in view["identity"].items() if k not in CONTENT_OF}} for view in every
    ]
    names = dict.fromkeys(name for view in values for name in view)  # any rank's: one may run other code
    differ = [name for name in names if any(theirs.get(name) != values[0].get(name) for theirs in values)]
    if differ:
        by_rank = "; ".join(f"{name}: {[theirs.get(name) for theirs in values]}" for name in differ[:4])
        problems.append(
            f"the ranks were started with different settings (by rank, {by_rank}"
            f"{f'; and {len(differ) - 4} more' if len(differ) > 4 else ''}): give every rank the same environment"
        )
    for key, (names, what, same) in CONTENT_OF.items():
        paths = [next((view["paths"][n] for n in names if view["paths"].get(n)), None) for view in every]
        seen = [(path, view["identity"].get(key)) for path, view in zip(paths, every, strict=True)]
        if len({content for _, content in seen}) > 1:
            copies = {}  # (path, content) -> ranks
            for rank, (path, content) in enumerate(seen):
                copies.setdefault((path, content), []).append(rank)
            by_rank = "; ".join(
                f"{ranks}: {path or '(not set)'} ({f'sha256 {content[:12]}' if content else 'none'})"
                for (path, content), ranks in copies.items()
            )
            problems.append(f"{what} between ranks (by rank: {by_rank}): give every node {same}")
    if missing := [rank for rank, view in enumerate(every) if view["output_lock"] != every[0]["output_lock"]]:
        where = {}  # (host, folder) -> ranks
        for rank in missing:
            where.setdefault((every[rank]["host"], every[rank]["output_dir"]), []).append(rank)
        folder = every[0]["output_dir"]
        ranks = ", ".join(
            f"{ranks} (host {host}{f', at {path}' if path != folder else ''})" for (host, path), ranks in where.items()
        )
        problems.append(
            f"OUTPUT_DIR {folder} is not one folder shared by every node: rank(s) {ranks} do not see rank 0's lock "
            f"file (.lock) there; checkpoints and the adapter would exist only on rank 0's node and a resume could not "
            f"find them: put OUTPUT_DIR on shared storage"
        )
    return problems


def check_replicas_identical(model, step: int) -> str:
    """All-gather the adapter checksum; stop every rank with the same error if any replica differs."""
    mine = adapter_checksum(model)
    sums = [None] * dist.get_world_size()
    dist.all_gather_object(sums, mine)
    if len(set(sums)) > 1:
        # Name the ranks outside the largest agreeing group (ties: rank 0's group), not "all but rank 0".
        majority = max(set(sums), key=lambda s: (sums.count(s), s == sums[0]))
        differing = [r for r, s in enumerate(sums) if s != majority]
        raise JobStopped(
            f"replica drift at step {step}: adapter weights on rank(s) {differing} differ from "
            f"the other ranks' (checksums by rank: {sums})"
        )
    return mine


# ----------------------------------------------------------------------------------------------
# DataLoader workers that live and die with their rank


class RankDataLoader(DataLoader):
    """A DataLoader whose workers live and die with this rank (bind_worker_to_rank). They are forked with SIGTERM
    blocked, so that every thread they start blocks it too: a thread started before worker_init_fn runs (an
    OpenMP pool, after torch.set_num_threads in the rank) would otherwise take a group-wide SIGTERM and die.

    Forking a process with threads (gloo's, NCCL's, this module's) can wait forever on a lock another thread held
    (seen, rarely, on 2 CPU cores: bench_results/fault-probes/session23-fork-hang.md). The fork holds the GIL, so
    no Python thread can tell: faulthandler's own thread prints every thread's stack and ends the rank if starting
    the workers takes START_TIMEOUT_S, instead of a job that waits silently (no collective is pending yet). That
    exit is C's _exit: torchrun's summary has no line for it, and rank 0's OUTPUT_DIR lock stays (the next run on
    this host takes it over at once, as its pid is gone; from another host after OutputLock.STALE_AFTER_S)."""

    START_TIMEOUT_S = 120.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, worker_init_fn=loader_worker_init(os.getpid()), **kwargs)

    def __iter__(self):
        blocks = hasattr(signal, "sigwaitinfo")  # not on macOS: SIGTERM keeps its default action in the workers
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM} if blocks else set())  # they fork now
        try:
            if self.num_workers:
                with contextlib.suppress(RuntimeError, ValueError, OSError):  # no stderr with a file descriptor
                    faulthandler.dump_traceback_later(self.START_TIMEOUT_S, exit=True, file=sys.__stderr__)
            batches = super().__iter__()
        finally:
            faulthandler.cancel_dump_traceback_later()
            signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a SIGTERM meanwhile reaches the rank now
        return self.workers_stacks_on_timeout(batches) if self.timeout else batches

    @staticmethod
    def workers_stacks_on_timeout(batches):
        """`batches`; on a timeout (no micro-batch in `timeout` s) each worker first prints its stacks (SIGUSR1,
        bind_worker_to_rank), then the rank reports."""
        try:
            yield from batches
        except RuntimeError as e:
            if LOADER_TIMED_OUT.search(str(e)):
                for worker in batches._workers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.pid, signal.SIGUSR1)
                time.sleep(1)  # the dumps, written by the workers' C handlers
            raise


def loader_worker_init(rank_pid: int):
    """The DataLoader's worker_init_fn for workers of the rank `rank_pid` (picklable under spawn too)."""
    return functools.partial(bind_worker_to_rank, rank_pid)


def bind_worker_to_rank(rank_pid: int, worker_id: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # torchrun passes a hangup on to the rank's whole group
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)  # and Ctrl-\ (SIGQUIT) likewise
    signal.set_wakeup_fd(-1)  # a forked worker inherits the rank's wakeup pipe: its signals are not the rank's
    with contextlib.suppress(RuntimeError, ValueError, OSError):  # no stderr with a file descriptor
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)  # its rank timed out on it
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if hasattr(signal, "sigwaitinfo"):  # not on macOS: there SIGTERM keeps its default action
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started from here inherit it
        threading.Thread(target=exit_on_sigterm_from, args=(rank_pid,), daemon=True, name="rank-sigterm").start()


def exit_on_sigterm_from(rank_pid: int) -> None:
    """Take every SIGTERM this process receives; exit (code 0: the loader's SIGCHLD check stays quiet)
    on the first one its rank sent."""
    while signal.sigwaitinfo({signal.SIGTERM}).si_pid != rank_pid:
        pass
    os._exit(0)


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, parent pid, ...); None once it is gone (Linux)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from the parent ids in /proc/*/stat (Linux)."""
    children: dict[int, list[int]] = {}
    for pid_dir in Path("/proc").glob("[0-9]*"):
        if fields := proc_stat(int(pid_dir.name)):
            children.setdefault(int(fields[1]), []).append(int(pid_dir.name))  # the field after the state: ppid
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process below it. torchrun starts each rank in its own session, so
    killing the launcher's process group alone would orphan them."""
    if proc.poll() is not None:
        return
    groups = {proc.pid}
    for pid in descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    proc.wait()
