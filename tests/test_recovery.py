"""Recovery, evaluation and guards (issue 5): real gloo jobs on CPU, each bounded in time.

One uninterrupted 2-rank run is the reference (module fixture); every interrupted-then-resumed run
must end with an adapter bitwise identical to it. Dropout is on, so the RNG handling is tested too.
"""

import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    BACKENDS,
    ENOUGH_GPUS,
    RANKS,
    ROOT,
    SAMPLE_DATA,
    TINY_MODEL,
    cpu_config,
    free_port,
    kill_tree,
    launch_env,
    stacks_then_kill,
    torchrun,
)
from safetensors.torch import load_file, save_file

import chat_data
import run_record
import train_ddp as T
from collate import PadCollate
from guards import OutputDirError
from lm_loss import CausalLMLoss

# 14 rows a rank, 2x2 per rank per step: 3 steps per epoch (one micro-batch dropped), 6 in all.
# Checkpoints at steps 2 (mid-epoch 0), 3 (epoch end), 4 (mid-epoch 1) and 6 (end); the last 2 kept.
RUN = {
    "MAX_LEN": "128",
    "MICRO_BATCH": "2",
    "ACCUM_STEPS": "2",
    "EPOCHS": "2",
    "NUM_WORKERS": "1",
    "LORA_DROPOUT": "0.1",
    "SAVE_EVERY": "2",
    "KEEP_CHECKPOINTS": "2",
    "EVAL_EVERY": "3",
    "DRIFT_CHECK_EVERY": "2",
    "DIST_TIMEOUT_S": "20",
}
TOTAL_STEPS = 6
FAULTY_TRAIN = ROOT / "tests" / "faulty_train.py"  # train_ddp.py with one injected fault (FAULT=KIND@STEP[@RANK])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    rows = SAMPLE_DATA.read_text().splitlines()
    train = [rows[i % 89] for i in range(14 * RANKS)]  # 14 rows a rank: 3 steps an epoch at any RANKS
    (d / "train.jsonl").write_text("\n".join(train) + "\n")
    (d / "eval.jsonl").write_text("\n".join(rows[89:96]) + "\n")  # 7 examples: not divisible by the ranks
    return {"DATA_PATH": str(d / "train.jsonl"), "EVAL_PATH": str(d / "eval.jsonl")}


def job_env(data, out, **overrides) -> dict:
    return {**RUN, **data, "OUTPUT_DIR": str(out), **overrides}


@pytest.fixture(scope="module")
def references(tmp_path_factory, data):
    """The uninterrupted run every recovery is compared against, one per backend (made when first asked)."""
    made = {}

    def reference_for(backend: str):
        if backend not in made:
            out = tmp_path_factory.mktemp(f"reference-{backend}")
            run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out), backend=backend)
            assert run.returncode == 0, run.output[-4000:]
            assert f"identical on all {RANKS} ranks" in run.output
            made[backend] = out
        return made[backend]

    return reference_for


@pytest.fixture(scope="module")
def reference(references):
    return references("gloo")


def adapter(out):
    return load_file(str(out / "adapter" / "adapter_model.safetensors"))


def assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys() and a
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, f"{len(unequal)}/{len(a)} tensors differ, e.g. {unequal[:3]}"


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def resumed_step(output: str) -> int:
    match = re.search(r"resumed from \S+step-(\d+) at step (\d+)", output)
    assert match and int(match[1]) == int(match[2]), output[-3000:]
    return int(match[2])


class Job:
    """A torchrun launch whose output is read while it runs: to act at a chosen moment, or to time it."""

    started: list = []  # killed after each test, whatever its outcome (see no_orphans)

    def __init__(self, env: dict, *torchrun_args: str, backend: str = "gloo"):
        script = FAULTY_TRAIN if "FAULT" in env else ROOT / "train_ddp.py"
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_args, str(script)]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, **launch_env(backend), **env},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []  # (monotonic time, line)
        self.ended = None  # when the output closed: the job is gone
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        Job.started.append(self)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))
        self.ended = time.monotonic()

    @classmethod
    def single_node(cls, env: dict, nproc: int = RANKS, backend: str = "gloo"):
        return cls(
            env,
            f"--nproc_per_node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            backend=backend,
        )

    @classmethod
    def two_nodes(cls, env: dict, node1_env: dict | None = None, *torchrun_args: str) -> list:
        """Two torchrun launches forming one job, one rank each; "node" 0 hosts the rendezvous store."""
        port = free_port()
        return [
            cls(
                env if n == 0 else node1_env or env,
                "--nnodes=2",
                f"--node-rank={n}",
                "--nproc_per_node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=two-nodes",
                f"--rdzv-conf=is_host={int(n == 0)}",
                *torchrun_args,
            )
            for n in (0, 1)
        ]

    @property
    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def wait_for(self, text: str, timeout: float = 120) -> float:
        """Monotonic time at which `text` first appeared in the output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = next((t for t, line in list(self.lines) if text in line), None)
            if hit is not None:
                return hit
            if self.proc.poll() is not None and not self.reader.is_alive():
                pytest.fail(f"job exited ({self.proc.returncode}) before printing {text!r}:\n{self.output[-4000:]}")
            time.sleep(0.02)
        (order,) = stacks_then_kill(self.proc)
        self.reader.join(10)
        pytest.fail(f"{text!r} not printed within {timeout}s ({order}):\n{self.output[-8000:]}")

    def wait(self, timeout: float = 120) -> int:
        return Job.wait_all([self], timeout)[0]

    @staticmethod
    def wait_all(jobs: list, timeout: float = 120) -> list[int]:
        """Every job's exit code; one still running at `timeout` fails the test with every job's output and
        the stacks of their processes (stacks_then_kill)."""
        deadline = time.monotonic() + timeout
        try:
            for job in jobs:
                job.proc.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            orders = stacks_then_kill(*(job.proc for job in jobs))
            for job in jobs:
                job.reader.join(10)
            outputs = "\n".join(
                f"--- launch {i}, {order}:\n{job.output[-16000:]}"
                for i, (job, order) in enumerate(zip(jobs, orders, strict=True))
            )
            pytest.fail(f"not finished within {timeout}s (hang?); every process's stacks follow the output:\n{outputs}")
        for job in jobs:
            job.reader.join(10)
        return [job.proc.returncode for job in jobs]

    def kill(self):
        """SIGKILL the launcher and every worker, as a preempted node would lose them."""
        kill_tree(self.proc)


@pytest.fixture(autouse=True)
def no_orphans():
    yield
    while Job.started:
        Job.started.pop().kill()


# ---------------------------------------------------------------- resume
def test_reference_run_keeps_only_the_last_checkpoints(reference):
    names = sorted(p.name for p in (reference / "checkpoints").iterdir())
    assert names == ["step-00000004", "step-00000006"]  # KEEP_CHECKPOINTS=2, no .tmp-/.old- leftovers
    assert [r["step"] for r in metrics(reference) if "loss" in r] == list(range(1, TOTAL_STEPS + 1))
    saves = [(r["step"], r["saved"]) for r in metrics(reference) if "saved" in r]  # time spent saving, per save
    assert saves == [(2, "checkpoint"), (3, "checkpoint"), (4, "checkpoint"), (6, "checkpoint"), (6, "adapter")]
    assert all(r["save_s"] > 0 for r in metrics(reference) if "saved" in r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_mid_run_then_resume_is_bitwise_exact(tmp_path, data, references, backend):
    reference = references(backend)
    out = tmp_path / "out"
    job = Job.single_node(job_env(data, out), backend=backend)
    job.wait_for("checkpoint step 2 saved")
    job.kill()
    assert job.proc.returncode == -signal.SIGKILL and "adapter checksum" not in job.output
    assert not (out / "adapter").exists()

    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out), backend=backend)  # RESUME=auto is the default
    assert run.returncode == 0, run.output[-4000:]
    step = resumed_step(run.output)
    assert 2 <= step < TOTAL_STEPS
    assert_bitwise_equal(adapter(out), adapter(reference))
    # the continuation reproduces the reference's logged losses and evaluation exactly, step for step
    tail = [r for r in metrics(out) if r["step"] > step]
    expected = [r for r in metrics(reference) if r["step"] > step]
    assert [(r["step"], r.get("loss"), r.get("eval_loss")) for r in tail[-len(expected) :]] == [
        (r["step"], r.get("loss"), r.get("eval_loss")) for r in expected
    ]


def test_resume_is_bitwise_at_3_ranks_too(tmp_path):
    """Above 2 ranks the all-reduce's float sums depend on DDP's bucket layout, which DDP changes after its
    first backward: a resumed run must reduce its first step in the layout the run it continues had."""
    rows = SAMPLE_DATA.read_text().splitlines()
    (tmp_path / "train.jsonl").write_text("\n".join(rows[:42]) + "\n")  # 14 a rank: 3 steps an epoch
    env = {**RUN, "DATA_PATH": str(tmp_path / "train.jsonl"), "EVAL_PATH": ""}
    reference = torchrun(ROOT / "train_ddp.py", nproc=3, env={**env, "OUTPUT_DIR": str(tmp_path / "reference")})
    assert reference.returncode == 0, reference.output[-4000:]
    job = Job.single_node({**env, "OUTPUT_DIR": str(tmp_path / "out")}, nproc=3)
    job.wait_for("checkpoint step 2 saved")
    job.kill()
    run = torchrun(ROOT / "train_ddp.py", nproc=3, env={**env, "OUTPUT_DIR": str(tmp_path / "out")})
    assert run.returncode == 0, run.output[-4000:]
    assert 2 <= resumed_step(run.output) < TOTAL_STEPS
    assert_bitwise_equal(adapter(tmp_path / "out"), adapter(tmp_path / "reference"))


def test_max_restarts_recovers_a_worker_that_dies_once(tmp_path, data, reference):
    out = tmp_path / "out"
    # torch 2.13 + c10d: the restarted group must not read the dead group's keys from the shared
    # rendezvous store (pytorch/pytorch#135712), hence TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun.
    env = job_env(data, out, FAULT="die@5@1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    run = torchrun(FAULTY_TRAIN, env=env, extra_torchrun_args=("--max_restarts=1",), timeout=240)
    assert run.returncode == 0, run.output[-4000:]
    assert "failed (exitcode: 17) local_rank: 1" in run.output  # the first attempt really lost rank 1
    assert resumed_step(run.output) == 4  # mid-epoch 1: one step of epoch 1 skipped, not re-tokenized
    assert_bitwise_equal(adapter(out), adapter(reference))


def test_crash_in_the_middle_of_a_save_keeps_the_previous_checkpoint(tmp_path, data, reference, monkeypatch):
    out = tmp_path / "out"
    run = torchrun(FAULTY_TRAIN, env=job_env(data, out, FAULT="save@4"))
    assert run.returncode != 0
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [".tmp-step-00000004", "step-00000002", "step-00000003"]
    assert not (ckpts / ".tmp-step-00000004" / "trainer_state.pt").exists()  # really half-written
    assert run_record.damage(ckpts / "step-00000003") is None

    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out))
    assert run.returncode == 0, run.output[-4000:]
    assert resumed_step(run.output) == 3  # the previous checkpoint loads, at an epoch boundary
    assert_bitwise_equal(adapter(out), adapter(reference))
    assert not list(ckpts.glob(".tmp-*"))


def test_resume_skips_consumed_samples_without_loading_them():
    class Recording(torch.utils.data.Dataset):
        def __init__(self):
            self.loaded = []

        def __len__(self):
            return 30

        def __getitem__(self, i):
            self.loaded.append(i)
            return i

    cfg = cpu_config(NUM_WORKERS=0, MICRO_BATCH=2, GROUP_BY_LENGTH=False)
    full = [b.tolist() for b in T.train_loader(Recording(), cfg, 1, 2, 3, 0, None)]
    dataset = Recording()
    resumed = [b.tolist() for b in T.train_loader(dataset, cfg, 1, 2, 3, 6, None)]
    assert resumed == full[3:]  # the same order, continued after 6 consumed samples (3 micro-batches)
    assert sorted(dataset.loaded) == sorted(sum(full[3:], []))  # skipped indices were never loaded


def disk_fills(folder):
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"2" * 50)
    raise OSError(errno.ENOSPC, "No space left on device", str(folder / "a.bin"))


def test_a_failed_save_says_why_removes_its_temporary_folder_and_keeps_the_previous_one(tmp_path, monkeypatch):
    final = tmp_path / "checkpoints" / "step-00000002"
    final.parent.mkdir()
    with pytest.raises(OutputDirError) as first:  # the first checkpoint: there is none to keep
        run_record.publish_atomically(final, disk_fills, expected_bytes=100)
    assert str(first.value).endswith("the temporary folder is removed; there is no earlier one to keep")
    run_record.publish_atomically(
        final, lambda d: d.mkdir() or (d / "a.bin").write_bytes(b"1" * 100), expected_bytes=100
    )

    (final.parent / "step-notes.txt").write_text("a user's file: not a checkpoint kept")
    later = final.with_name("step-00000004")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(2**30, 2**30 - 557_056, 557_056))
    with pytest.raises(OutputDirError) as second:
        run_record.publish_atomically(later, disk_fills, expected_bytes=3 * 2**20)
    assert str(second.value) == (
        f"saving {later} failed: no space left on the device (544 KiB free in {final.parent}, this save needs "
        f"over 3.0 MiB); the temporary folder is removed and step-00000002 kept; older checkpoints are pruned "
        f"only once a new one is whole: KEEP_CHECKPOINTS of them need room beside it"
    )
    assert sorted(p.name for p in final.parent.iterdir()) == ["step-00000002", "step-notes.txt"]  # no .tmp- left
    assert run_record.damage(final) is None and (final / "a.bin").read_bytes() == b"1" * 100


# ---------------------------------------------------------------- evaluation
def test_distributed_eval_equals_single_process_eval_of_the_whole_file(data, reference):
    from peft import set_peft_model_state_dict
    from transformers import AutoTokenizer

    evals = [r for r in metrics(reference) if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3, 6]  # EVAL_EVERY=3; the end (step 6) is not evaluated twice

    cfg = cpu_config()
    tokenizer = AutoTokenizer.from_pretrained(cfg.MODEL_ID)
    peft_model = T.add_lora(T.load_model(cfg, torch.device("cpu")), cfg)
    set_peft_model_state_dict(peft_model, adapter(reference))
    rows = chat_data.load_conversations(data["EVAL_PATH"])
    batch = PadCollate(tokenizer.pad_token_id)([chat_data.tokenize_conversation(tokenizer, r, 128, True) for r in rows])
    with torch.no_grad():
        loss_sum, n_targets = CausalLMLoss(peft_model, cfg.CE_CHUNK_TOKENS).eval()(
            **batch
        )  # all 7 examples, one process
    assert evals[-1]["eval_targets"] == int(n_targets)  # each example counted exactly once
    assert evals[-1]["eval_loss"] == pytest.approx(float(loss_sum) / int(n_targets), rel=1e-5, abs=0)


# ---------------------------------------------------------------- guards
def test_nan_on_one_rank_is_skipped_by_every_rank(tmp_path, data):
    out = tmp_path / "out"
    run = torchrun(
        FAULTY_TRAIN,
        env=job_env(
            data,
            out,
            FAULT="nan@3@1",
            NAN_POLICY="skip",
            MAX_STEPS="4",
            SAVE_EVERY="1",
            KEEP_CHECKPOINTS="9",
            DRIFT_CHECK_EVERY="1",
            EVAL_PATH="",
        ),
    )
    assert run.returncode == 0, run.output[-4000:]
    assert f"identical on all {RANKS} ranks" in run.output
    steps = {r["step"]: r for r in metrics(out) if "loss" in r}
    assert [s for s, r in steps.items() if r["skipped"]] == [3] and math.isnan(steps[3]["loss"])
    assert (
        "warning: 1 of 4 steps skipped their update (non-finite loss or gradient; NAN_POLICY=skip): steps 3"
        in run.output
    )
    ckpt = {s: load_file(str(out / "checkpoints" / f"step-{s:08d}" / "adapter_model.safetensors")) for s in (2, 3)}
    assert_bitwise_equal(ckpt[3], ckpt[2])  # step 3 changed nothing (and, per the drift check, on no rank)
    assert all(not torch.equal(adapter(out)[k], ckpt[3][k]) for k in ckpt[3] if "lora_B" in k)  # step 4 trained


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gpu_out_of_memory_ends_the_job_in_one_line_that_names_a_memory_target(tmp_path, data, backend):
    # in the first forward, where a layout too large for the GPU fails (fault step 0: before step 1)
    run = torchrun(FAULTY_TRAIN, timeout=120, backend=backend, env=job_env(data, tmp_path / "out", FAULT="oom@0@1"))
    assert run.returncode != 0
    said = re.search(
        r"^\[rank 1\] error: out of GPU memory \(tried to allocate [\d.]+ GiB on a ([\d.]+) GiB GPU with [\d.]+ \w+ in "
        r"use(?:; other processes hold ([\d.]+) GiB of it \(nvidia-smi names them\))?\): MEMORY_TARGET_GIB=(\d+) makes "
        r"the planner choose a layout predicted to fit, or lower MICRO_BATCH or MAX_LEN(?:, or end the other "
        r"processes)?; python memory_budget.py MODEL_ID shows what each part needs \(before optimizer step 1\)$",
        run.output,
        re.M,
    )  # other processes: the lane's other test, on the same GPUs
    assert said and abs(int(said[3]) - (float(said[1]) - float(said[2] or 0)) * 0.93) <= 1, run.output[-4000:]
    own_report = run.output.split("[rank 1] error:")[1].split("[rank 0]")[0]
    assert "Traceback" not in own_report, run.output[-4000:]  # one line, not a stack
    summary = r"traceback : OutOfMemoryError: out of GPU memory \(tried .*\(before optimizer step 1\)$"
    assert re.search(summary, run.output, re.M), run.output[-4000:]  # torchrun's summary: the same line


def test_nan_on_one_rank_with_stop_policy_stops_every_rank(tmp_path, data):
    run = torchrun(
        FAULTY_TRAIN, timeout=120, env=job_env(data, tmp_path / "out", FAULT="nan@2@1", NAN_POLICY="stop", EVAL_PATH="")
    )
    assert run.returncode != 0
    errors = run.errors()  # an expected stop: one line each, no traceback of ours above torchrun's own
    assert sorted(rank for rank, _ in errors) == [0, 1], run.output[-4000:]  # one line per rank
    for _, line in errors:
        assert re.fullmatch(
            r"non-finite loss or gradient norm at step 2 .*NAN_POLICY=stop "
            r"\(in optimizer step 2; last completed step: 1\)",
            line,
        ), line
    assert run.output.count("Traceback (most recent call last)") == 1, run.output[-6000:]  # torchrun's
    summary = r"traceback : JobStopped: non-finite loss .*\(in optimizer step 2; last completed step: 1\)$"
    assert re.search(summary, run.output, re.M), run.output[-4000:]  # torchrun's summary names the root cause
    assert "adapter checksum" not in run.output


def test_a_run_whose_every_step_skipped_its_update_ends_in_an_error_without_an_adapter_even_when_run_again(
    tmp_path, data
):
    """The count of updates is checkpointed: run again, the job resumes from its last step (an epoch end, saved)
    and still does not publish the unchanged adapter."""
    out = tmp_path / "out"
    for script, why in [(FAULTY_TRAIN, "non-finite loss or gradient; NAN_POLICY=skip"), (ROOT / "train_ddp.py", "")]:
        run = torchrun(script, timeout=120, env=job_env(data, out, FAULT="nan@*", NAN_POLICY="skip", EVAL_PATH=""))
        assert run.returncode != 0
        errors = run.errors()
        assert sorted(rank for rank, _ in errors) == [0, 1], run.output[-4000:]
        for _, line in errors:
            assert line.startswith(
                f"all {TOTAL_STEPS} steps of this run skipped their update ({why or 'in earlier attempts'}): "
                "the adapter did not change, so it is not saved"
            ), line
        assert not (out / "adapter").exists()
    assert resumed_step(run.output) == TOTAL_STEPS


def test_drift_on_one_rank_stops_the_job_naming_that_rank(tmp_path, data):
    # 3 ranks, rank 0 drifts: the message must name rank 0, not "everyone but rank 0"
    job = Job.single_node(job_env(data, tmp_path / "out", FAULT="drift@1@0", EVAL_PATH=""), nproc=3)
    assert job.wait(180) != 0
    assert "replica drift at step 2: adapter weights on rank(s) [0] differ" in job.output, job.output[-4000:]
    assert "(after optimizer step 2; last completed step: 2)" in job.output


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_rank_ends_the_whole_job_within_the_timeout(tmp_path, data, backend, record_property):
    job = Job.single_node(job_env(data, tmp_path / "out", FAULT="die@2@1", EVAL_PATH=""), backend=backend)
    t_step1 = job.wait_for("step 1 |")
    assert job.wait(120) != 0
    record_property("seconds_after_step_1", round(job.ended - t_step1, 1))
    assert job.ended - t_step1 < int(RUN["DIST_TIMEOUT_S"]), f"took {job.ended - t_step1:.1f}s"
    assert "failed (exitcode: 17) local_rank: 1" in job.output, job.output[-4000:]  # torchrun names the dead rank


def test_killed_rank_on_another_node_makes_the_survivor_exit_with_its_stack(tmp_path, data):
    # No common launcher stops the survivor here: its own failed collective has to.
    nodes = Job.two_nodes(job_env(data, tmp_path / "out", FAULT="die@2@1", EVAL_PATH=""))
    codes = Job.wait_all(nodes, 120)
    assert all(code != 0 for code in codes)
    dead = next(n for n in nodes if "failed (exitcode: 17)" in n.output)
    survivor = next(n for n in nodes if n is not dead)
    t_death = dead.wait_for("failed (exitcode: 17)")
    assert survivor.ended - t_death < int(RUN["DIST_TIMEOUT_S"]), f"took {survivor.ended - t_death:.1f}s"
    report = survivor.output[survivor.output.index("[rank 0] failed after optimizer step 2; last completed step: 2") :]
    assert "Traceback" in report and "RuntimeError" in report, survivor.output[-4000:]


def test_a_lost_rank_0_and_its_store_are_named_once_and_the_restarted_nodes_resume(tmp_path, data, reference):
    """README's several-nodes command: under TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 rank 0's process holds the store
    the ranks share. When it dies, the survivor says so (not "the launcher is gone") with one page of torch's C++
    frames at most (each further call to the dead store would log another), and --max_restarts resumes the job."""
    env = job_env(data, tmp_path / "out", FAULT="die@2@0", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    nodes = Job.two_nodes(env, None, "--max_restarts=1")
    assert Job.wait_all(nodes, 240) == [0, 0], [node.output[-3000:] for node in nodes]
    survivor = next(node.output for node in nodes if "[rank 1] rank 0 is gone" in node.output)
    assert "[rank 1] rank 0 is gone (the rendezvous store it holds does not answer: " in survivor, survivor[-3000:]
    assert "launcher" not in survivor and survivor.count("frame #0:") <= 1, survivor[-6000:]
    assert_bitwise_equal(adapter(tmp_path / "out"), adapter(reference))


@pytest.mark.parametrize("dump_folder", ["OUTPUT_DIR", "unwritable"])
def test_stuck_rank_becomes_an_error_with_a_stack_after_the_timeout(tmp_path, data, dump_folder):
    timeout_s = 8
    unwritable = {"TORCH_FR_DUMP_TEMP_FILE": "/proc/no-such-folder/flight_recorder_rank_"}
    job = Job.single_node(
        job_env(data, tmp_path / "out", FAULT="hang@2@1", EVAL_PATH="", DIST_TIMEOUT_S=str(timeout_s))
        | (unwritable if dump_folder == "unwritable" else {})
    )
    t_step2 = job.wait_for("step 2 |")  # rank 0 finished step 2; rank 1 is stuck before finishing it
    assert job.wait(120) != 0
    elapsed = job.ended - t_step2
    assert timeout_s * 0.8 < elapsed < timeout_s + 20, f"took {elapsed:.1f}s"
    # rank 0 finished step 2 and waited in its next collective (the drift check) until the timeout
    report = job.output[job.output.index("[rank 0] failed after optimizer step 2; last completed step: 2") :]
    assert "Traceback" in report and "check_replicas_identical" in report and "Timed out" in report, report[:4000]
    assert re.search(r"\[rank 0\] stuck in gloo:all_gather #\d+ .*ranks that never entered it: \[1\]", report), report[
        -2000:
    ]
    dump = re.search(r"\[rank 0\] stuck in .*flight recorder dump: (\S+) ", report)[1]
    if dump_folder == "OUTPUT_DIR":
        assert dump == str(tmp_path / "out" / "flight_recorder_rank_0")
    else:  # the report falls back to the temporary folder
        assert dump.startswith(f"{tempfile.gettempdir()}/flight_recorder_rank_0_")
    assert Path(dump).stat().st_size > 0
    if dump_folder == "unwritable":
        Path(dump).unlink()


def test_ranks_waiting_in_collectives_that_do_not_match_time_out_without_calling_each_other_gone(tmp_path, data):
    """Rank 1 enters a barrier rank 0 never enters: both wait, alive, and fail at the same moment. Each must
    not read the other's pause while reporting as a dead process ("stopped beating: the process is gone")."""
    timeout_s = 8
    job = Job.single_node(
        job_env(data, tmp_path / "out", FAULT="desync@2@1", EVAL_PATH="", DIST_TIMEOUT_S=str(timeout_s))
    )
    t_step2 = job.wait_for("step 2 |")
    assert job.wait(120) != 0
    assert job.ended - t_step2 < timeout_s + 20, f"took {job.ended - t_step2:.1f}s"
    assert "[rank 0] failed after optimizer step 2" in job.output and "Timed out" in job.output, job.output[-4000:]
    assert "stopped beating" not in job.output, job.output[-4000:]


@pytest.mark.gpu
@pytest.mark.skipif(not ENOUGH_GPUS, reason=f"needs {RANKS} CUDA devices")
def test_stuck_rank_on_nccl_ends_with_the_jobs_own_report(tmp_path, data, record_property):
    # NCCL never raises in Python: the job's HangWatchdog must end it, before NCCL's SIGABRT
    timeout_s = 30
    job = Job.single_node(
        job_env(data, tmp_path / "out", FAULT="hang@2@1", EVAL_PATH="", DIST_TIMEOUT_S=str(timeout_s)), backend="nccl"
    )
    t_step2 = job.wait_for("step 2 |")
    assert job.wait(180) != 0
    elapsed = job.ended - t_step2
    record_property("seconds_after_step_2", round(elapsed, 1))
    assert timeout_s * 0.8 < elapsed < timeout_s + 30, f"took {elapsed:.1f}s"
    report = job.output[
        job.output.index("[rank 0] collective timeout after optimizer step 2; last completed step: 2") :
    ]
    assert re.search(r"nccl:all_gather #\d+ .*ranks that never entered it: \[1\]", report), report[:3000]
    assert "check_replicas_identical" in report and "SIGABRT" not in job.output, report[:3000]
    assert (tmp_path / "out" / "flight_recorder_rank_0").stat().st_size > 0
    assert not (tmp_path / "out" / ".lock").exists()  # released on the way out: a rerun need not wait for it


# ---------------------------------------------------------------- multi-node
def test_two_node_launch_on_one_machine_completes(tmp_path, data, reference):
    out = tmp_path / "out"  # shared by both "nodes", as OUTPUT_DIR on shared storage would be
    nodes = Job.two_nodes(job_env(data, out))
    codes = Job.wait_all(nodes, 180)
    assert codes == [0, 0], "\n".join(node.output[-3000:] for node in nodes)
    assert "identical on all 2 ranks" in "".join(node.output for node in nodes)
    # one rank per node computes exactly what one rank per process did on one node
    assert_bitwise_equal(adapter(out), adapter(reference))


def node_local_output_dirs_stop_every_rank(data, node0: Path, node1: Path) -> None:
    """Two "nodes", each with its own OUTPUT_DIR (a node-local folder): both ranks stop at the first collective
    with the same line, naming the rank that does not see rank 0's lock (c10d puts rank 0 on either node)."""
    nodes = Job.two_nodes(job_env(data, node0), job_env(data, node1))
    assert all(code != 0 for code in Job.wait_all(nodes, 120)), "\n".join(node.output[-3000:] for node in nodes)
    output = "".join(node.output for node in nodes)
    lines = re.findall(r"^\[rank (\d)\] error: (.*)$", output, re.M)
    assert sorted(rank for rank, _ in lines) == ["0", "1"] and lines[0][1] == lines[1][1], output[-3000:]
    assert re.fullmatch(
        rf"OUTPUT_DIR ({re.escape(str(node0))}|{re.escape(str(node1))}) is not one folder shared by every node: "
        rf"rank\(s\) \[1\] \(host {re.escape(socket.gethostname())}, at ({re.escape(str(node0))}|"
        rf"{re.escape(str(node1))})\) do not see rank 0's lock file \(\.lock\) there; checkpoints and the adapter "
        r"would exist only on rank 0's node and a resume could not find them: put OUTPUT_DIR on shared storage",
        lines[0][1],
    ), lines[0][1]
    for out in (node0, node1):  # not one step trained, nothing saved
        assert not (out / "metrics.jsonl").exists() and not (out / "adapter").exists()


def test_node_local_output_dirs_stop_every_rank_before_training(tmp_path, data):
    """A fresh run: had it trained, checkpoints and the adapter would exist on rank 0's node only, and the
    first resume (after a preemption, the steps since launch) would be refused."""
    node_local_output_dirs_stop_every_rank(data, tmp_path / "node0", tmp_path / "node1")


def test_nodes_that_see_different_checkpoints_stop_instead_of_desynchronising(tmp_path, data, reference):
    # OUTPUT_DIR wrongly node-local: only node 0 sees a checkpoint, so ranks would resume from different steps
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shutil.copytree(reference / "checkpoints" / "step-00000004", node0 / "checkpoints" / "step-00000004")
    node_local_output_dirs_stop_every_rank(data, node0, node1)


@pytest.mark.parametrize("failing", [1, 0])
def test_a_node_whose_data_is_bad_ends_the_other_node_that_waits_for_it(tmp_path, data, failing):
    """Node `failing`'s copy of DATA_PATH has a broken row: its rank stops before the process group forms. The
    other node's rank, waiting for it to join (up to DIST_INIT_TIMEOUT_S), ends within seconds with the failing
    rank's line. Node 0's agent serves the store: when node 0 fails, the store goes with it, and the waiting rank's
    own failure to form the group is not what it reports."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(Path(data["DATA_PATH"]).read_text() + "{not json\n")
    paths = [data["DATA_PATH"], data["DATA_PATH"]]
    paths[failing] = str(bad)
    nodes = Job.two_nodes(*(job_env(data, tmp_path / "out", DIST_INIT_TIMEOUT_S="600", DATA_PATH=p) for p in paths))
    codes = Job.wait_all(nodes, 90)
    output = "".join(node.output for node in nodes)
    assert all(code != 0 for code in codes), output[-4000:]
    failed = re.search(rf"^\[rank (\d)\] error: ({re.escape(str(bad))}:\d+: .*)$", nodes[failing].output, re.M)
    assert failed, output[-4000:]
    waiting = re.findall(r"^\[rank \d\] error: (.*)$", nodes[1 - failing].output, re.M)
    assert waiting == [f"rank {failed[1]} failed before the group formed: {failed[2]}"], output[-4000:]
    if failing == 1:  # torchrun's summary (node 1's own agent, its rendezvous gone with node 0, ends in a traceback)
        assert f"GroupNotFormed: {waiting[0]}" in nodes[0].output, output[-4000:]


def copy_checkpoints(reference, out):
    shutil.copytree(reference / "checkpoints", out / "checkpoints")


def shuffled_copy(path, out):
    """The same rows (so the same size) in another order: other data, by content."""
    rows = path.read_text().splitlines(keepends=True)
    out.write_text("".join(rows[1:] + rows[:1]))
    assert out.stat().st_size == path.stat().st_size
    return out


# (what changed, environment, difference listed, can RESUME_ALLOW_CHANGES=1 override it)
CHANGED = {
    "lr": ({"LR": "1e-4"}, "LR: checkpoint 0.0002, now 0.0001", True),
    "lora-alpha": ({"LORA_ALPHA": "64"}, "LORA_ALPHA: checkpoint 32, now 64", True),
    "data-content": (None, "data_sha256: checkpoint", True),
    "lora-r": ({"LORA_R": "8", "RESUME_ALLOW_CHANGES": "1"}, "LORA_R: checkpoint 16, now 8", False),
    "batch-shape": ({"ACCUM_STEPS": "1"}, f"global_batch: checkpoint {4 * RANKS}, now {2 * RANKS}", False),
    "seed-mid-epoch": (
        {"SEED": "7", "RESUME_ALLOW_CHANGES": "1"},
        "SEED: checkpoint 1234, now 7 (mid-epoch: cannot change)",
        False,
    ),
}


@pytest.mark.parametrize("case", list(CHANGED))
def test_a_checkpoint_of_another_run_is_named_and_refused(tmp_path, data, reference, case):
    overrides, listed, allowable = CHANGED[case]
    out = tmp_path / "out"
    copy_checkpoints(reference, out)  # newer than anything this run wrote: RESUME=auto finds it first
    step = 4 if case == "seed-mid-epoch" else 6  # step 4 is mid-epoch 1, step 6 an epoch end
    if case == "seed-mid-epoch":
        shutil.rmtree(out / "checkpoints" / "step-00000006")
    if overrides is None:
        overrides = {"DATA_PATH": str(shuffled_copy(Path(data["DATA_PATH"]), tmp_path / "train.jsonl"))}
    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out, **overrides), timeout=120)
    assert run.returncode != 0
    # one message, the same on every rank that printed it before torchrun stopped the job (the first
    # rank to exit makes torchrun kill the other, which may not have printed yet)
    lines = [line for _, line in run.errors()]
    assert lines and len(set(lines)) == 1, run.output[-3000:]
    assert f"checkpoints/step-{step:08d} was written with other settings (" in lines[0] and listed in lines[0], lines[0]
    assert ("RESUME_ALLOW_CHANGES=1" in lines[0]) == allowable
    assert "size mismatch" not in run.output and not (out / "adapter").exists()
    # torchrun's last screen names the cause too (the worker's error file), not error_file: <N/A>
    assert re.search(
        r"Root Cause[\s\S]*error_file: \S+error.json[\s\S]*InputError: \S+ was written with other settings", run.output
    ), run.output[-3000:]


def test_a_finished_run_started_again_says_so_and_changes_nothing(tmp_path, data, reference):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    before = adapter(out)
    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out))
    assert run.returncode == 0 and "this run is already complete (6 of 6 steps): nothing to train" in run.output
    assert_bitwise_equal(adapter(out), before)
    assert [r["step"] for r in metrics(out) if "loss" in r] == list(range(1, TOTAL_STEPS + 1))  # nothing logged


def test_a_finished_run_that_ended_mid_epoch_stays_finished_even_when_its_data_changed(tmp_path, data):
    out, changed = tmp_path / "out", tmp_path / "changed.jsonl"
    env = job_env(data, out, MAX_STEPS="2", EVAL_PATH="")  # step 2 of 3 in epoch 0: no checkpoint there
    assert torchrun(ROOT / "train_ddp.py", env=env).returncode == 0
    before = adapter(out)
    rerun = torchrun(ROOT / "train_ddp.py", env=env)
    assert rerun.returncode == 0 and "this run is already complete (2 of 2 steps): nothing to train." in rerun.output
    changed.write_text("\n".join(Path(data["DATA_PATH"]).read_text().splitlines()[1:]) + "\n")
    config = (out / "config.json").read_text()
    rerun = torchrun(ROOT / "train_ddp.py", env={**env, "DATA_PATH": str(changed)})
    assert rerun.returncode == 0, rerun.output[-3000:]
    assert (
        f"this run is already complete (2 of 2 steps): nothing to train; DATA_PATH's content differs from the "
        f"data it was trained on ({changed})" in rerun.output
    ), rerun.output[-3000:]
    assert_bitwise_equal(adapter(out), before)
    assert (out / "config.json").read_text() == config  # still the settings and data it was trained with
    assert [r["step"] for r in metrics(out) if "loss" in r] == [1, 2]  # nothing trained again


def test_a_rerun_that_cannot_continue_a_finished_run_without_checkpoints_is_refused_and_changes_nothing(tmp_path, data):
    out = tmp_path / "out"
    env = job_env(data, out, MAX_STEPS="2", EVAL_PATH="")  # step 2 of 3 in epoch 0: no checkpoint there
    assert torchrun(ROOT / "train_ddp.py", env=env).returncode == 0
    assert not list((out / "checkpoints").glob("step-*"))
    before = adapter(out)
    refusals = [  # other settings would train from scratch over the adapter; an adapter has no optimizer state
        ({"LR": "1e-4"}, f"{out / 'adapter'} is the final adapter of another run (LR: adapter 0.0002, now 0.0001) and"),
        ({"RESUME": str(out / "adapter")}, f"RESUME={str(out / 'adapter')!r} is a final adapter, not a checkpoint"),
    ]
    for overrides, message in refusals:
        rerun = torchrun(ROOT / "train_ddp.py", env={**env, **overrides})
        lines = [line for _, line in rerun.errors()]
        assert rerun.returncode != 0 and lines and len(set(lines)) == 1, rerun.output[-3000:]
        assert message in lines[0] and "FileNotFoundError" not in rerun.output, rerun.output[-3000:]
    assert_bitwise_equal(adapter(out), before)
    assert [r["step"] for r in metrics(out) if "loss" in r] == [1, 2]  # nothing trained again


def test_a_resume_with_the_optimizer_state_on_the_host_continues_the_reference_bitwise(tmp_path, data, reference):
    """OPTIMIZER_OFFLOAD is a layout, not a training setting: from the reference's step 4, steps 5 and 6 with
    AdamW's state in host memory between steps end on the reference's adapter."""
    out = tmp_path / "out"
    copy_checkpoints(reference, out)
    shutil.rmtree(out / "checkpoints" / "step-00000006")
    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out, OPTIMIZER_OFFLOAD="1"))
    assert run.returncode == 0 and resumed_step(run.output) == 4, run.output[-3000:]
    assert "OPTIMIZER_OFFLOAD=True" in run.output  # the effective settings say so
    assert_bitwise_equal(adapter(out), adapter(reference))


def test_resume_with_allowed_changes_or_a_copy_of_the_data_or_model_continues(tmp_path, data, reference):
    """The data and the model are known by their content: a copy elsewhere resumes (the model's path was compared,
    so a moved checkout could not resume), other weights in the same place do not (they resumed silently)."""
    out = tmp_path / "out"
    copy_checkpoints(reference, out)
    shutil.rmtree(out / "checkpoints" / "step-00000006")  # resume at step 4: steps 5 and 6 train again
    copy, model, other = tmp_path / "same-rows-elsewhere.jsonl", tmp_path / "model-copy", tmp_path / "other-weights"
    shutil.copy(data["DATA_PATH"], copy)
    for folder in (model, other):
        shutil.copytree(TINY_MODEL, folder)
    weights = load_file(str(other / "model.safetensors"))
    save_file({name: w + 0.01 for name, w in weights.items()}, str(other / "model.safetensors"), {"format": "pt"})
    refused = torchrun(ROOT / "train_ddp.py", env=job_env(data, out, MODEL_ID=str(other)))
    lines = [line for _, line in refused.errors()]
    assert refused.returncode != 0 and lines and len(set(lines)) == 1, refused.output[-3000:]
    assert "step-00000004 was trained on other base weights than MODEL_ID's now" in lines[0], lines[0]
    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out, DATA_PATH=str(copy), MODEL_ID=str(model)))
    assert run.returncode == 0 and resumed_step(run.output) == 4, run.output[-3000:]
    assert_bitwise_equal(adapter(out), adapter(reference))  # the same data is the same data, wherever it lies

    changed = {"LR": "1e-4", "WEIGHT_DECAY": "0.1", "EPOCHS": "3", "RESUME_ALLOW_CHANGES": "1"}
    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out, **changed))
    assert run.returncode == 0, run.output[-3000:]
    assert re.search(
        r"warning: resuming \S+step-00000006 with changed settings \(RESUME_ALLOW_CHANGES=1\): "
        r"EPOCHS: checkpoint 2, now 3; LR: checkpoint 0.0002, now 0.0001; WEIGHT_DECAY: checkpoint 0.0, now 0.1",
        run.output,
    ), run.output[-3000:]
    assert resumed_step(run.output) == 6 and [r["step"] for r in metrics(out) if "loss" in r][-3:] == [7, 8, 9]
    # the changes take effect: the schedule is the new LR's over the new 9 steps (warmup 2, then cosine) ...
    logged = {r["step"]: r["lr"] for r in metrics(out) if "loss" in r}
    assert [logged[step] for step in (7, 8, 9)] == [
        1e-4 * 0.5 * (1 + math.cos(math.pi * (n - 2) / 7)) for n in (6, 7, 8)
    ]
    # ... and the optimizer's own values, as saved at step 9, are this run's
    (group,) = torch.load(out / "checkpoints" / "step-00000009" / "trainer_state.pt")["optimizer"]["param_groups"]
    assert (group["initial_lr"], group["weight_decay"]) == (1e-4, 0.1)
    config = json.loads((out / "config.json").read_text())
    assert config["resumed_from"].endswith("step-00000006") and config["settings"]["LR"] == {
        "value": 1e-4,
        "source": "env",
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checkpoint_resumes_on_another_gpu_count_that_keeps_its_global_batch(tmp_path, data, references, backend):
    reference, out = references(backend), tmp_path / "out"
    copy_checkpoints(reference, out)
    shutil.rmtree(out / "checkpoints" / "step-00000006")  # resume at step 4, mid-epoch 1
    one_rank = job_env(data, out, ACCUM_STEPS=str(RANKS * 2))  # 1 rank x 2 x RANKS*2: the reference's global batch
    run = torchrun(ROOT / "train_ddp.py", nproc=1, env=one_rank, backend=backend)
    assert run.returncode == 0 and resumed_step(run.output) == 4, run.output[-3000:]
    # steps 5 and 6 train exactly the reference's samples: its tokens and targets, its loss up to dropout masks
    ours, theirs = ({r["step"]: r for r in metrics(o) if "loss" in r} for o in (out, reference))
    for step in (5, 6):
        assert [ours[step][k] for k in ("tokens", "targets")] == [theirs[step][k] for k in ("tokens", "targets")]
        assert ours[step]["loss"] == pytest.approx(
            theirs[step]["loss"], rel=1e-3 if backend == "gloo" else 1e-2
        )  # bf16
    assert json.loads((out / "config.json").read_text())["world_size"] == 1


DAMAGE = {
    "two-bytes-flipped": lambda c: (c / "adapter_model.safetensors").write_bytes(
        (lambda b: b[:1000] + bytes([b[1000] ^ 1, b[1001] ^ 1]) + b[1002:])(
            (c / "adapter_model.safetensors").read_bytes()
        )
    ),
    "truncated": lambda c: (c / "adapter_model.safetensors").write_bytes(
        (c / "adapter_model.safetensors").read_bytes()[:5000]
    ),
    "trainer-state-missing": lambda c: (c / "trainer_state.pt").unlink(),
    "trainer-state-garbage": lambda c: (c / "trainer_state.pt").write_bytes(b"garbage"),
    "empty-newer-folder": lambda c: (c.parent / "step-00000009").mkdir(),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_named_and_the_newest_intact_one_resumed(tmp_path, data, reference, case):
    out = tmp_path / "out"
    copy_checkpoints(reference, out)
    newest = out / "checkpoints" / "step-00000006"
    if case == "empty-newer-folder":
        shutil.rmtree(newest)  # then step 4 is the newest intact one, and an empty step-9 lies above it
    DAMAGE[case](newest)
    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out))
    assert run.returncode == 0, run.output[-3000:]
    assert re.search(r"warning: skipping damaged checkpoint \S+step-0000000[69]: ", run.output), run.output[-3000:]
    assert resumed_step(run.output) == 4
    assert_bitwise_equal(adapter(out), adapter(reference))


@pytest.mark.parametrize(
    "backend, sig",
    [
        pytest.param(*b.values, signal.SIGTERM, marks=b.marks) if hasattr(b, "values") else (b, signal.SIGTERM)
        for b in BACKENDS
    ]
    + [("gloo", signal.SIGHUP), ("gloo", signal.SIGQUIT)],  # on NCCL both take SIGTERM's path (GracefulStop)
    ids=lambda v: getattr(v, "name", v),
)
def test_a_stop_signal_to_the_launcher_saves_at_the_next_step_and_resumes_bitwise(
    tmp_path, data, references, backend, sig
):
    """SIGTERM is what a cluster sends at preemption; SIGHUP what a closed terminal sends, SIGQUIT Ctrl-\\ (torchrun
    passes each on to each rank's process group, the loaders' workers included)."""
    reference = references(backend)
    out = tmp_path / "out"
    job = Job.single_node(
        job_env(data, out, SAVE_EVERY="0", SAVE_ON_SIGTERM="1", NUM_WORKERS="2"), backend=backend
    )  # no periodic checkpoint
    job.wait_for("step 1 |")
    job.proc.send_signal(sig)
    job.wait(60)
    assert_gone_soon_after_last_line(job)  # the loaders' workers too, which also received the signal
    stopped = re.search(
        rf"stopped by {sig.name} after step (\d+): \S+step-\d+ saved; the same command resumes", job.output
    )
    assert stopped and (out / "checkpoints" / f"step-{int(stopped[1]):08d}").is_dir(), job.output[-3000:]
    assert [(r["step"], r["saved"]) for r in metrics(out) if "saved" in r] == [(int(stopped[1]), "checkpoint")]
    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out), backend=backend)
    assert run.returncode == 0 and resumed_step(run.output) == int(stopped[1])
    assert_bitwise_equal(adapter(out), adapter(reference))


def test_ctrl_c_while_the_process_group_forms_ends_every_rank_at_once(tmp_path, data):
    """Rank 1 is late, so rank 0 waits inside init_process_group (C++), where Python's KeyboardInterrupt would
    wait for torchrun's SIGKILL 30 s later. Nothing is trained yet: nothing to save."""
    job = Job.single_node(job_env(data, tmp_path / "out", FAULT="late@0@1"))
    job.wait_for("forming the process group")
    time.sleep(1)  # rank 0 inside init_process_group
    signalled = time.monotonic()
    job.proc.send_signal(signal.SIGINT)  # torchrun passes it on to both ranks
    job.wait(25)
    assert job.ended - signalled < 10, job.output[-3000:]
    for rank in range(RANKS):
        assert f"[rank {rank}] SIGINT: exiting at once, without a checkpoint" in job.output, job.output[-3000:]
    assert not (tmp_path / "out" / ".lock").exists()  # released: a rerun on another host need not wait for it


def test_sigterm_as_an_evaluation_starts_saves_that_step_and_auto_resumes_this_run_not_an_older_ones(
    tmp_path, data, reference
):
    """A fresh start (RESUME='') over another run's later checkpoints sets them aside; a SIGTERM as step 3's
    evaluation starts ends the evaluation within a batch, step 3 is saved, and RESUME=auto continues this run
    (not the other's step 6) to the reference's adapter, running step 3's evaluation first."""
    out = tmp_path / "out"
    copy_checkpoints(reference, out)  # steps 4 and 6: past anything this run writes before it stops
    run = torchrun(FAULTY_TRAIN, env=job_env(data, out, FAULT="term@3@1", RESUME=""))
    assert run.returncode == 0, run.output[-4000:]
    assert re.search(
        r"what another line of training saved past step 0 \(step-00000004, step-00000006\) was moved to "
        rf"{out}/checkpoints/set-aside-\d+-\d+: RESUME=auto continues this run",
        run.output,
    ), run.output[-4000:]
    assert "evaluation at step 3 skipped: stopped by SIGTERM on rank 1" in run.output, run.output[-4000:]
    assert re.search(
        r"stopped by SIGTERM on rank 1 after step 3: \S+step-00000003 saved; RESUME=auto \(or RESUME=\S+\) resumes",
        run.output,
    ), run.output[-4000:]
    assert [r["step"] for r in metrics(out) if "eval_loss" in r] == []  # the evaluation was abandoned
    assert [p.name for p in sorted((out / "checkpoints").glob("step-*"))] == ["step-00000002", "step-00000003"]
    again = torchrun(FAULTY_TRAIN, env=job_env(data, out, FAULT="term@3@1"))  # stopped again, in that evaluation
    assert again.returncode == 0 and resumed_step(again.output) == 3, again.output[-3000:]
    assert re.search(
        r"stopped by SIGTERM on rank 1 before step 4: \S+step-00000003 still holds this state", again.output
    )
    assert [p.name for p in sorted((out / "checkpoints").glob("step-*"))] == ["step-00000002", "step-00000003"]
    resumed = torchrun(ROOT / "train_ddp.py", env=job_env(data, out))
    assert resumed.returncode == 0 and resumed_step(resumed.output) == 3, resumed.output[-3000:]
    assert_bitwise_equal(adapter(out), adapter(reference))
    assert resumed.output.index("eval | step 3 |") < resumed.output.index("step 4 |"), resumed.output[-3000:]
    evals = [[(r["step"], r["eval_loss"]) for r in metrics(o) if "eval_loss" in r] for o in (out, reference)]
    assert evals[0] == evals[1] and len(evals[0]) == 2, evals  # steps 3 and 6, on the very same weights


def test_sigterm_as_the_final_evaluation_starts_leaves_it_and_the_adapter_to_the_rerun(tmp_path, data, reference):
    """A stop that skips the final evaluation checkpoints the last step instead of saving the adapter (which would
    make the rerun find the run complete, its evaluation never run): the rerun evaluates the very weights the
    reference evaluated, then saves the adapter."""
    out, env = tmp_path / "out", {"EVAL_EVERY": "0"}  # the final evaluation only
    run = torchrun(FAULTY_TRAIN, env=job_env(data, out, FAULT=f"term@{TOTAL_STEPS}@1", **env))
    assert run.returncode == 0, run.output[-4000:]
    assert "final evaluation skipped: stopped by SIGTERM on rank 1" in run.output, run.output[-4000:]
    assert f"after step {TOTAL_STEPS}: {out}/checkpoints/step-{TOTAL_STEPS:08d} saved" in run.output, run.output[-3000:]
    assert not (out / "adapter").exists()
    again = torchrun(FAULTY_TRAIN, env=job_env(data, out, FAULT=f"term@{TOTAL_STEPS}@1", **env))  # in it again
    assert again.returncode == 0 and resumed_step(again.output) == TOTAL_STEPS, again.output[-3000:]
    assert re.search(
        rf"stopped by SIGTERM on rank 1 before the adapter is saved: \S+step-{TOTAL_STEPS:08d} still holds this state",
        again.output,
    ), again.output[-3000:]
    assert not (out / "adapter").exists()
    rerun = torchrun(ROOT / "train_ddp.py", env=job_env(data, out, **env))
    assert rerun.returncode == 0 and resumed_step(rerun.output) == TOTAL_STEPS, rerun.output[-3000:]
    assert rerun.output.index("eval | final |") < rerun.output.index("saved to"), rerun.output[-3000:]
    assert_bitwise_equal(adapter(out), adapter(reference))  # the evaluations never touch the training
    evals = [
        [r["eval_loss"] for r in metrics(o) if r["step"] == TOTAL_STEPS and "eval_loss" in r] for o in (out, reference)
    ]
    assert evals[0] == evals[1] and len(evals[0]) == 1, evals


# ---------------------------------------------------------------- the job ends
def assert_gone_soon_after_last_line(job, bound_s: float = 5.0):
    """Every process of the job ended within bound_s of its last line (the output closes only when the
    loaders' workers, which hold it too, have ended)."""
    t_last, last = job.lines[-1]
    assert job.ended - t_last < bound_s, f"still running {job.ended - t_last:.1f}s after its last line {last!r}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_job_is_gone_within_5_s_of_its_last_line_even_with_its_loaders_still_referenced(tmp_path, data, backend):
    env = job_env(data, tmp_path / "out", FAULT="linger@0", NUM_WORKERS="2", EVAL_PATH="")
    for run in ("trains", "finds the run complete"):
        job = Job.single_node(env, backend=backend)
        assert job.wait(120) == 0, f"{run}:\n{job.output[-3000:]}"
        assert "load it: PeftModel.from_pretrained(" in job.lines[-1][1], job.output[-3000:]
        assert_gone_soon_after_last_line(job)
    assert "this run is already complete" in job.output


@contextlib.contextmanager
def tmpfs(path: Path):
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs (to turn it read-only mid-run) needs root")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.mark.parametrize("fault", ["vanish", "readonly"])
def test_an_output_dir_that_vanishes_or_turns_read_only_ends_every_rank_with_a_line_naming_it(tmp_path, data, fault):
    out = tmp_path / "out"
    with tmpfs(out) if fault == "readonly" else contextlib.nullcontext():
        job = Job.single_node(job_env(data, out, FAULT=f"{fault}@2@0", NUM_WORKERS="2", EVAL_PATH=""))
        t_step1 = job.wait_for("step 1 |")
        assert job.wait(120) == 1
    assert job.ended - t_step1 < int(RUN["DIST_TIMEOUT_S"]), f"took {job.ended - t_step1:.1f}s"
    for rank in (0, 1):
        last = [line for _, line in job.lines if line.startswith(f"[rank {rank}] ")][-1]
        assert f"OUTPUT_DIR {out.resolve()} cannot be read or written any more" in last, job.output[-4000:]
    assert_gone_soon_after_last_line(job)


def test_ranks_whose_launcher_is_killed_stop_with_a_checkpoint_that_resumes(tmp_path, data):
    out = tmp_path / "out"
    env = job_env(data, out, SAVE_EVERY="0", NUM_WORKERS="2", EPOCHS="8")  # 24 steps; no periodic checkpoint
    job = Job.single_node(env)
    job.wait_for("step 1 |")
    t_kill = time.monotonic()
    job.proc.kill()  # the launcher alone (as an OOM killer might): the ranks run in sessions of their own
    job.reader.join(60)  # the output closes when the ranks and their workers are gone
    assert job.ended is not None and job.ended - t_kill < int(RUN["DIST_TIMEOUT_S"]), job.output[-3000:]
    for rank in (0, 1):  # seen as its own parent's exit: before the store it held is asked (a page of C++ frames)
        assert re.search(rf"\[rank {rank}\] the launcher is gone \(its process \d+ exited\): stopping", job.output), (
            job.output[-3000:]
        )
    assert "frame #0:" not in job.output, job.output[-6000:]
    stopped = re.search(r"stopped by the loss of the launcher after step (\d+): \S+ saved", job.output)
    assert stopped and int(stopped[1]) < 24, job.output[-3000:]
    assert run_record.damage(out / "checkpoints" / f"step-{int(stopped[1]):08d}") is None
    assert "Exception in thread" not in job.output
    run = torchrun(ROOT / "train_ddp.py", env=env)
    assert run.returncode == 0 and resumed_step(run.output) == int(stopped[1]), run.output[-3000:]
    assert [r["step"] for r in metrics(out) if "loss" in r][-1] == 24


def test_a_second_job_into_the_same_output_dir_is_refused_and_a_dead_jobs_lock_taken_over(tmp_path, data, reference):
    out = tmp_path / "out"
    first = Job.single_node(job_env(data, out, FAULT="hang@2@1", DIST_TIMEOUT_S="60"))  # holds the lock
    first.wait_for("step 1 |")
    second = torchrun(ROOT / "train_ddp.py", env=job_env(data, out), timeout=120)
    assert second.returncode != 0
    assert re.search(
        rf"\[rank 0\] error: {out} is in use by another job \(host \S+, pid \d+, started ", second.output
    ), second.output[-3000:]
    first.kill()  # SIGKILL: its lock stays behind, naming a pid that no longer runs
    assert (out / ".lock").exists()
    run = torchrun(ROOT / "train_ddp.py", env=job_env(data, out))
    assert run.returncode == 0, run.output[-3000:]
    assert_bitwise_equal(adapter(out), adapter(reference))
    assert not (out / ".lock").exists() and not list(out.glob(".lock*")), list(out.iterdir())  # nothing left


def test_a_lost_store_host_is_named_as_such_on_the_node_whose_launcher_lives(tmp_path, data):
    """Plain c10d: node 0's agent serves the rendezvous store. Killed, its own rank sees its launcher gone; node 1's
    rank, whose launcher lives, names the store's (not "the launcher"). The agents look at their ranks once an hour:
    node 1's would otherwise fail on the lost store too, ending its rank before the rank can tell."""
    nodes = Job.two_nodes(job_env(data, tmp_path / "out", SAVE_EVERY="0", EPOCHS="8"), None, "--monitor-interval=3600")
    nodes[0].wait_for("step 1 |")
    nodes[0].proc.kill()
    for node in nodes:
        node.wait_for("is gone (", timeout=60)
    said = [re.findall(r"^\[rank \d\] (.* is gone \(.*?\)): stopping", node.output, re.M) for node in nodes]
    assert re.fullmatch(r"the launcher is gone \(its process \d+ exited\)", said[0][0]), said
    assert len(said[1]) == 1 and re.fullmatch(
        r"the launcher serving the rendezvous store at \S+:\d+ is gone "
        r"\(the rendezvous store it holds does not answer: DistNetworkError\)",
        said[1][0],
    ), nodes[1].output[-3000:]


def test_a_node_whose_own_launcher_is_killed_stops_the_job_with_a_checkpoint(tmp_path, data):
    """Node 1's agent holds no store: its ranks see it gone as their parent's exit, and every rank stops."""
    out = tmp_path / "out"
    nodes = Job.two_nodes(job_env(data, out, SAVE_EVERY="0", NUM_WORKERS="2", EPOCHS="8"))  # 24 steps
    nodes[0].wait_for("step 1 |")
    nodes[1].proc.kill()
    nodes[1].reader.join(60)  # its rank is gone
    assert re.search(r"\[rank 1\] the launcher is gone \(its process \d+ exited\): stopping", nodes[1].output), nodes[
        1
    ].output[-3000:]
    nodes[0].wait_for("stopped by another rank after step", timeout=60)  # then torchelastic's exit barrier waits
    nodes[0].kill()  # for the lost agent (300 s)
    stopped = re.search(r"stopped by another rank after step (\d+): \S+ saved", nodes[0].output)
    assert stopped and int(stopped[1]) < 24, nodes[0].output[-3000:]
    assert run_record.damage(out / "checkpoints" / f"step-{int(stopped[1]):08d}") is None
