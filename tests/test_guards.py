"""guards.py: a DataLoader worker ignores the SIGTERM that torchrun or a cluster sends to the whole process
group, ends when its own rank stops it, and dies with its rank."""

import errno
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import alive, wait_until, writes_to

import guards

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and sigwaitinfo are Linux's")


@pytest.mark.parametrize("threads_set", [False, True], ids=["plain", "after-set_num_threads"])
def test_a_worker_ignores_another_process_sigterm_and_ends_on_its_own_ranks(threads_set):
    if threads_set:  # the worker then starts a thread before worker_init_fn: it must block SIGTERM too
        torch.set_num_threads(torch.get_num_threads())
    batches = iter(guards.RankDataLoader(range(1000), batch_size=10, num_workers=1))
    assert next(batches).tolist() == list(range(10))
    (worker,) = batches._workers
    subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)  # as torchrun's killpg at preemption
    for sig in ("INT", "QUIT", "HUP"):  # as Ctrl-C, Ctrl-\ and a closed terminal, which torchrun passes on
        subprocess.run(["kill", f"-{sig}", str(worker.pid)], check=True)
    time.sleep(0.5)
    assert alive(worker.pid)
    assert next(batches).tolist() == list(range(10, 20))  # the rank's step can still finish
    os.kill(worker.pid, signal.SIGTERM)  # what multiprocessing does to daemonic children at exit
    worker.join(5)
    assert worker.exitcode == 0  # 0: the loader's SIGCHLD check does not report it as a failure
    del batches


CHILD = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import guards
batches = iter(guards.RankDataLoader(range(100), num_workers=2))
next(batches)
print(" ".join(str(w.pid) for w in batches._workers), flush=True)
time.sleep(0.3)
os._exit(1)  # a failed rank: no cleanup, its loader still referenced
"""


def test_workers_die_with_their_rank():
    rank = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(Path(guards.__file__).parent)], stdout=subprocess.PIPE, text=True
    )
    pids = [int(p) for p in rank.stdout.readline().split()]  # not communicate(): the workers hold the pipe too
    assert rank.wait(60) == 1 and len(pids) == 2
    assert wait_until(lambda: not any(alive(p) for p in pids), timeout=2.0), [p for p in pids if alive(p)]
    rank.stdout.close()


STUCK_FORK = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import guards
guards.RankDataLoader.START_TIMEOUT_S = 2
os.register_at_fork(before=lambda: time.sleep(600))  # a fork that waits, as on a lock another thread holds
next(iter(guards.RankDataLoader(range(100), num_workers=1)))
"""


def test_a_rank_whose_loader_cannot_fork_its_workers_ends_with_every_threads_stack():
    """The fork holds the GIL while it waits: no Python thread (not HangWatchdog) can report, and before the loop's
    first all-reduce no peer waits on a collective either. The job would wait silently forever."""
    rank = subprocess.run(
        [sys.executable, "-c", STUCK_FORK, str(Path(guards.__file__).parent)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rank.returncode == 1, rank.stderr[-2000:]
    assert rank.stderr.startswith("Timeout (0:00:02)!\n"), rank.stderr[-2000:]
    assert re.search(r'File ".*guards\.py", line \d+ in __iter__', rank.stderr), rank.stderr[-2000:]


def test_a_report_reaches_stderr_in_one_write_with_its_newline(monkeypatch):
    """Ranks share torchrun's pipe: a line written in two parts (print's text, then its newline) lets a peer's
    line land in between (seen in CI: "...NAN_POLICY=stop[rank 1] error: ...")."""
    writes = writes_to(monkeypatch, "stderr")
    guards.to_stderr("[rank 0] error: non-finite loss")
    assert writes == ["[rank 0] error: non-finite loss\n"]


STOPPING = """
import sys, time
sys.path.insert(0, sys.argv[1])
import guards

class Watchdog:  # what GracefulStop asks of guards.HangWatchdog, for a rank alone
    rank, position = 0, "in optimizer step 3"
    heartbeats, stopped_beating, first_failure = dict, lambda self, before, now: [], str
    post_stop = lambda self, reason: None
    def report(self, text):
        guards.to_stderr(f"[rank {self.rank}] {text}")

stop = guards.GracefulStop()
stop.install(rank=0)
if sys.argv[2] == "armed":  # training under way: a stop signal finishes the step first
    stop.arm(Watchdog())
print("ready", flush=True)
time.sleep(60)  # a step that takes long: the first Ctrl-C waits for its end
"""


def stopping_rank(armed: bool = True, **popen) -> subprocess.Popen:
    """A rank with GracefulStop installed, in the middle of a long step (armed) or before training."""
    rank = subprocess.Popen(
        [sys.executable, "-c", STOPPING, str(Path(guards.__file__).parent), "armed" if armed else "before"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    assert rank.stdout.readline() == "ready\n"
    return rank


def still_running_after(rank: subprocess.Popen, sig: signal.Signals) -> bool:
    rank.send_signal(sig)
    time.sleep(0.5)
    return rank.poll() is None


def test_a_second_ctrl_c_says_it_exits_at_once_without_a_checkpoint():
    rank = stopping_rank()
    assert still_running_after(rank, signal.SIGINT)  # the first one waits for the step's end
    rank.send_signal(signal.SIGINT)
    assert rank.wait(10) == 128 + signal.SIGINT
    assert rank.stderr.read() == "[rank 0] a second Ctrl-C: exiting at once, without a checkpoint\n"


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP], ids=lambda sig: sig.name
)
def test_a_stop_signal_before_training_ends_the_rank_at_once(sig):
    """Nothing to save yet; and a rank blocked in C++ (forming the process group) would see Python's
    KeyboardInterrupt only when torchrun SIGKILLs it."""
    rank = stopping_rank(armed=False)
    rank.send_signal(sig)
    assert rank.wait(10) == 128 + sig
    assert rank.stderr.read() == f"[rank 0] {sig.name}: exiting at once, without a checkpoint\n"


@pytest.mark.parametrize("first", [signal.SIGQUIT, signal.SIGINT], ids=["ctrl-backslash", "ctrl-c"])
def test_ctrl_backslash_is_a_stop_at_the_steps_end_and_after_a_stop_quits_at_once(first):
    """torchrun passes Ctrl-\\'s SIGQUIT on to the ranks: Python's default killed each at once, with no checkpoint,
    no line, and rank 0's lock left. After a stop (a Ctrl-C, or a first Ctrl-\\) it is the user's "now"."""
    rank = stopping_rank()
    assert still_running_after(rank, first)  # waits for the step's end
    rank.send_signal(signal.SIGQUIT)
    assert rank.wait(10) == 128 + signal.SIGQUIT
    assert rank.stderr.read() == "[rank 0] Ctrl-\\ after a stop: exiting at once, without a checkpoint\n"


@pytest.mark.parametrize("nohup", [False, True], ids=["terminal", "nohup"])
def test_a_hangup_stops_at_the_end_of_the_step_unless_the_job_ignores_it(nohup):
    """A closed terminal's SIGHUP (torchrun passes it on) is a stop request like SIGTERM, so the next Ctrl-C is
    the second one; under nohup it stays ignored, and the next Ctrl-C is the first."""
    rank = stopping_rank(preexec_fn=(lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None)
    assert still_running_after(rank, signal.SIGHUP)
    if nohup:
        assert still_running_after(rank, signal.SIGINT)
    rank.send_signal(signal.SIGINT)
    assert rank.wait(10) == 128 + signal.SIGINT
    assert rank.stderr.read() == "[rank 0] a second Ctrl-C: exiting at once, without a checkpoint\n"


class AgentStore:
    """torchrun's agent store, served here: the environment a rank sees under torchrun (c10d, no restarts)."""

    def __init__(self, monkeypatch):
        self.server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.server.port), **AGENT}.items():
            monkeypatch.setenv(name, value)

    def posted(self) -> str:
        """The first failure posted, as the waiting ranks read it."""
        store = guards.launch_store("failures-before-group")
        return store.get("1").decode() if store.add("count", 0) else ""


AGENT = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "test", "TORCHELASTIC_MAX_RESTARTS": "0"}


class Stop:  # what FailuresBeforeGroup asks of GracefulStop; leave() records instead of ending pytest
    before_group, left = None, None

    def leave(self, code: int) -> None:
        self.left = code


def failing_before_group(rank: int, error: Exception) -> None:
    with pytest.raises(type(error)), guards.FailuresBeforeGroup(rank, 2, Stop()):
        raise error


def test_the_first_failure_before_the_group_forms_is_the_one_posted(monkeypatch):
    store = AgentStore(monkeypatch)
    monkeypatch.setattr(guards.FailuresBeforeGroup, "GRACE_S", 0.5)  # nobody reads: the first post lingers
    failing_before_group(1, guards.InputError("data.jsonl:3: not valid JSON"))
    failing_before_group(0, guards.InputError("data.jsonl:9: not valid JSON"))
    assert store.posted() == "rank 1 failed before the group formed: data.jsonl:3: not valid JSON"


def test_a_group_that_did_not_form_is_posted_unless_a_peers_failure_was_read(monkeypatch):
    """Where NCCL fails to start on one node only, the others wait in NCCL's start, which has no timeout: the
    failure is posted. Where a peer's failure was read, that is the cause, and it is what this rank reports."""
    store = AgentStore(monkeypatch)
    waiting = guards.FailuresBeforeGroup(0, 2, Stop())
    start = time.monotonic()
    failing_before_group(1, guards.GroupNotFormed("the process group of 2 ranks did not form: NCCL error"))
    assert time.monotonic() - start < 5  # the failed rank lingers until the other one read its line, not GRACE_S
    line = "rank 1 failed before the group formed: the process group of 2 ranks did not form: NCCL error"
    assert store.posted() == line and waiting.seen == line
    with pytest.raises(guards.GroupNotFormed) as reported, waiting:
        raise guards.GroupNotFormed("the process group of 2 ranks did not form: connection reset")
    assert str(reported.value) == line and waiting.stop.left is None


def test_a_rank_whose_group_failed_before_its_watch_polled_reports_the_peers_line(monkeypatch):
    """The waiting rank's own group failed while its watch had not yet read the peer's line (its poll pending, or
    in flight): it reported 'did not form', posted that, and the cause was lost on its node."""
    store = AgentStore(monkeypatch)
    monkeypatch.setattr(guards.FailuresBeforeGroup, "POLL_S", 60.0)  # the watch never polls in this test
    monkeypatch.setattr(guards.FailuresBeforeGroup, "GRACE_S", 0.5)  # so the failed rank's linger ends unread
    waiting = guards.FailuresBeforeGroup(0, 2, Stop())
    failing_before_group(1, guards.InputError("data.jsonl:3: not valid JSON"))
    with pytest.raises(guards.GroupNotFormed) as reported, waiting:
        raise guards.GroupNotFormed("the process group of 2 ranks did not form: connection reset")
    assert (
        str(reported.value) == store.posted() == "rank 1 failed before the group formed: data.jsonl:3: not valid JSON"
    )


STOPPED_BY_AGENT = """
import sys, time
sys.path.insert(0, sys.argv[1])
import guards
stop = guards.GracefulStop()
stop.install(rank=0)
waiting = guards.FailuresBeforeGroup(0, 2, stop)
while waiting.seen is None:
    time.sleep(0.1)
print("read", flush=True)
time.sleep(60)  # still loading the model when the agent, its store gone with the failed node, sends SIGTERM
"""


def test_a_rank_stopped_by_its_agent_after_a_peer_failed_reports_the_peers_line(monkeypatch):
    store = AgentStore(monkeypatch)
    rank = subprocess.Popen(
        [sys.executable, "-c", STOPPED_BY_AGENT, str(Path(guards.__file__).parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    failing_before_group(1, guards.InputError("data.jsonl:3: not valid JSON"))  # lingers until rank 0 read it
    assert rank.stdout.readline() == "read\n"
    rank.send_signal(signal.SIGTERM)
    assert rank.wait(10) == 2
    assert rank.stderr.read() == f"[rank 0] error: {store.posted()}\n"


def test_a_full_disk_without_a_file_name_and_a_killed_data_worker_are_one_line(tmp_path):
    """TensorBoard's writer reports a full disk without a file name, and the kernel's out-of-memory killer ends a
    DataLoader worker: each was a page of traceback with no cause named."""
    full = guards.one_line(OSError(errno.ENOSPC, "No space left on device"), str(tmp_path))
    df = f"df -h {tmp_path.resolve()} shows OUTPUT_DIR's"
    assert full == f"no space left on a device ({df}): [Errno 28] No space left on device"
    killed = guards.one_line(RuntimeError("DataLoader worker (pid 18690) is killed by signal: Killed. "), "out")
    assert killed == (
        "a data loader worker was killed (DataLoader worker (pid 18690) is killed by signal: Killed; SIGKILL, most "
        "often the kernel's out-of-memory killer): lower NUM_WORKERS, or give the job more host memory"
    )
    assert guards.one_line(RuntimeError("DataLoader worker (pid 7) exited unexpectedly"), "out") is None  # a bug


class KilledWorker(list):
    """A dataset whose loader worker is killed (as by the out-of-memory killer) at its second sample."""

    def __getitem__(self, i):
        if i == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


def test_a_worker_killed_while_the_rank_waits_for_its_batch_is_one_line():
    """torch raises 'exited unexpectedly' from the worker's own error when the rank waits in next(): the line for a
    killed worker was given only when the rank was elsewhere."""
    with pytest.raises(RuntimeError) as waited:
        list(guards.RankDataLoader(KilledWorker(range(4)), num_workers=1))
    assert "exited unexpectedly" in str(waited.value)
    assert guards.one_line(waited.value, "out").startswith("a data loader worker was killed (DataLoader worker (pid ")


def test_an_out_of_memory_message_in_other_words_is_quoted_and_still_answered():
    """torch before 2.1 worded it otherwise: the line keeps what torch said, and the remedy stands."""
    said = "CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB already)"
    line = guards.one_line(torch.OutOfMemoryError(said), "out")
    assert line == (
        f"out of GPU memory ({said[:120]}): MEMORY_TARGET_GIB=<the GPU GiB less 7%> makes the planner choose a layout "
        f"predicted to fit, or lower MICRO_BATCH or MAX_LEN; python memory_budget.py MODEL_ID shows "
        f"what each part needs"
    )


def test_out_of_memory_names_what_other_processes_hold_and_plans_without_it():
    """A run left behind on the same GPU (torch's message lists it): the target is 93% of what it leaves."""
    said = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 12.50 MiB "
        "is free. Process 4242 has 40.00 GiB memory in use. Including non-PyTorch memory, this process has 39.17 GiB "
        "memory in use. Of the allocated memory 37.02 GiB is allocated by PyTorch"
    )
    assert guards.out_of_memory(said) == (
        "out of GPU memory (tried to allocate 2.00 GiB on a 79.19 GiB GPU with 39.17 GiB in use; other processes hold "
        "40.0 GiB of it (nvidia-smi names them)): MEMORY_TARGET_GIB=36 makes the planner choose a layout predicted to "
        "fit, or lower MICRO_BATCH or MAX_LEN, or end the other processes; python memory_budget.py MODEL_ID shows "
        "what each part needs"
    )  # 0.93 x (79.19 - 40.0) = 36.4
    assert "MEMORY_TARGET_GIB=36 plans a smaller layout" in guards.out_of_memory(said, memory_target_gib=70)
    alone = said.replace("Process 4242 has 40.00 GiB memory in use. ", "").replace("39.17", "79.17")
    assert "other processes" not in guards.out_of_memory(alone) and "MEMORY_TARGET_GIB=73 " in guards.out_of_memory(
        alone
    )


def test_out_of_memory_under_a_memory_target_asks_for_a_lower_one():
    """The planner chose the layout: lowering MICRO_BATCH does nothing then; a lower target does."""
    said = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 1.0 GiB"
    assert guards.out_of_memory(said, memory_target_gib=130) == (
        "out of GPU memory (tried to allocate 2.00 GiB on a 139.80 GiB GPU): MEMORY_TARGET_GIB=130 was not low enough; "
        "MEMORY_TARGET_GIB=117 plans a smaller layout, or lower MAX_LEN"
    )


# ---------------------------------------------------------------- the first collective: what every rank read
MAY_DIFFER = ("MODEL_ID", "MODEL_CONFIG", "DATA_PATH", "EVAL_PATH", "OUTPUT_DIR")  # as train_ddp's, for these cases
LOCK = {"host": "h0", "pid": 42, "started": "2026-01-01 00:00:00", "process": "pid:[1] boot 7"}  # rank 0's


def rank_view(monkeypatch, host="h0", lock=LOCK, identity=None, **settings) -> dict:
    """What check_same_settings all-gathers on a rank of host `host` that reads `lock` in its OUTPUT_DIR."""
    values = {
        "MODEL_ID": "/models/tiny",
        "MODEL_CONFIG": "",
        "DATA_PATH": "/shared/chat.jsonl",
        "EVAL_PATH": "",
        "OUTPUT_DIR": "/shared/out",
        "LR": 2e-4,
        **settings,
    }
    identity = {"data_sha256": "1fd511f8" * 8, "eval_sha256": "", "global_batch": 16, **(identity or {})}
    gathered = []
    monkeypatch.setattr(guards.socket, "gethostname", lambda: host)
    monkeypatch.setattr(guards.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(
        guards.dist, "all_gather_object", lambda every, mine: (gathered.append(mine), every.__setitem__(0, mine))
    )
    guards.check_same_settings(
        {n: {"value": v, "source": "env"} for n, v in values.items()}, identity, MAY_DIFFER, lock
    )
    return gathered[0]


def first_collective(views: list[dict]) -> str:
    """The error every rank raises when the ranks read `views` (by rank); '' if none."""
    problems = guards.differences_between_ranks(views)
    return "; ".join(problems)


def test_a_node_local_copy_that_differs_names_the_input_not_the_environment(monkeypatch):
    """Every rank had the same environment; a node's copy of the data (or model) is another file: the line says
    which input, where each rank read it, and that the nodes need the same file."""
    stale = {"data_sha256": "5f37f57f" * 8}
    views = [
        rank_view(monkeypatch),
        rank_view(monkeypatch, host="h1", DATA_PATH="/local/chat.jsonl", identity=stale),
        rank_view(monkeypatch, host="h1", DATA_PATH="/local/chat.jsonl", identity=stale),
    ]
    assert first_collective(views) == (
        "DATA_PATH's content differs between ranks (by rank: [0]: /shared/chat.jsonl (sha256 1fd511f81fd5); "
        "[1, 2]: /local/chat.jsonl (sha256 5f37f57f5f37)): give every node the same file"
    )
    other_model = {"model_weights_sha256": "ab" * 32}
    views = [
        rank_view(monkeypatch, identity={"model_weights_sha256": "cd" * 32}),
        rank_view(monkeypatch, identity=other_model),
    ]
    assert first_collective(views).startswith(
        "MODEL_ID's weights differ between ranks (by rank: [0]: /models/tiny (sha256 cdcdcdcdcdcd); [1]: /models/tiny "
        "(sha256 abababababab)): give every node the same model files"
    )
    # a copy of the same content elsewhere is fine: the paths may differ by node
    views = [rank_view(monkeypatch), rank_view(monkeypatch, DATA_PATH="/local/chat.jsonl", MODEL_ID="/local/tiny")]
    assert first_collective(views) == ""


def test_settings_that_differ_keep_their_advice_beside_a_copy_that_differs(monkeypatch):
    views = [
        rank_view(monkeypatch),
        rank_view(monkeypatch, LR=1e-3, EVAL_PATH="/local/eval.jsonl", identity={"eval_sha256": "ee" * 32}),
    ]
    assert first_collective(views) == (
        "the ranks were started with different settings (by rank, LR: [0.0002, 0.001]): give every rank the same "
        "environment; EVAL_PATH's content differs between ranks (by rank: [0]: (not set) (none); [1]: "
        "/local/eval.jsonl (sha256 eeeeeeeeeeee)): give every node the same file"
    )


def test_a_setting_only_a_later_rank_has_is_a_difference(monkeypatch):
    """A rank running other code reads a constant rank 0 does not know: compared over every rank's names."""
    views = [rank_view(monkeypatch), rank_view(monkeypatch, NEW_KNOB=1)]
    assert first_collective(views) == (
        "the ranks were started with different settings (by rank, NEW_KNOB: [None, 1]): give every rank the same "
        "environment"
    )


def test_a_rank_that_does_not_see_rank_0s_lock_has_another_output_dir(monkeypatch):
    """OUTPUT_DIR may differ by node as a path, but must be one folder: a rank that reads no lock there (a
    node-local folder), or another job's old one, is named with its host."""
    others_lock = {**LOCK, "pid": 7, "host": "h2"}  # a killed job's, in a node-local folder
    views = [
        rank_view(monkeypatch),
        rank_view(monkeypatch, host="h0"),  # rank 0's node: the same folder
        rank_view(monkeypatch, host="h1", lock=None),
        rank_view(monkeypatch, host="h1", lock=None),
        rank_view(monkeypatch, host="h2", lock=others_lock, OUTPUT_DIR="/scratch/out"),
    ]
    assert first_collective(views) == (
        "OUTPUT_DIR /shared/out is not one folder shared by every node: rank(s) [2, 3] (host h1), [4] (host h2, at "
        "/scratch/out) do not see rank 0's lock file (.lock) there; checkpoints and the adapter would exist only on "
        "rank 0's node and a resume could not find them: put OUTPUT_DIR on shared storage"
    )
    shared = [rank_view(monkeypatch), rank_view(monkeypatch, host="h1", OUTPUT_DIR="/mnt/shared/out")]  # another mount
    assert first_collective(shared) == ""


def test_every_rank_raises_what_the_first_collective_found(monkeypatch):
    """check_same_settings raises, on each rank, the one line built from the same all-gathered views."""
    theirs = rank_view(monkeypatch, host="h1", lock=None)
    mine = rank_view(monkeypatch)
    monkeypatch.setattr(guards.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(
        guards.dist, "all_gather_object", lambda every, _: every.__setitem__(slice(None), [mine, theirs])
    )
    with pytest.raises(guards.InputError, match=r"^OUTPUT_DIR /shared/out is not one folder shared by every node: "):
        guards.check_same_settings(
            {n: {"value": v, "source": "env"} for n, v in {"OUTPUT_DIR": "/shared/out"}.items()}, {}, MAY_DIFFER, LOCK
        )
