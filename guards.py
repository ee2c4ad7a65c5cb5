"""Process lifetimes: DataLoader workers that live and die with their rank; a launched job ended whole.

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
- Ctrl-C at the terminal reaches the whole foreground group: the rank handles it, the worker ignores it.
"""

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def loader_worker_init(rank_pid: int):
    """The DataLoader's worker_init_fn for workers of the rank `rank_pid` (picklable under spawn too)."""
    return functools.partial(bind_worker_to_rank, rank_pid)


def bind_worker_to_rank(rank_pid: int, worker_id: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.set_wakeup_fd(-1)  # a forked worker inherits the rank's wakeup pipe: its signals are not the rank's
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


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from the parent ids in /proc/*/stat (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # the field after the state
            children.setdefault(ppid, []).append(int(stat.parent.name))
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
