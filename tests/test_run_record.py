"""run_record.py: identity differences, checkpoint manifests and the OUTPUT_DIR lock (in-process)."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from conftest import cpu_config

import run_record
from guards import InputError


def test_differences_list_structural_changes_first():
    saved = {"LR": 2e-4, "LORA_R": 16, "data_sha256": "a", "SEED": 1}
    now = {"LR": 1e-4, "LORA_R": 8, "data_sha256": "b", "SEED": 1}
    assert run_record.differences(saved, now) == [
        "LORA_R: checkpoint 16, now 8",
        "LR: checkpoint 0.0002, now 0.0001",
        "data_sha256: checkpoint 'a', now 'b'",
    ]
    assert run_record.differences(saved, dict(saved)) == []


def test_identity_names_data_by_content_not_path(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    a.write_text('{"x": 1}\n{"x": 2}\n')
    b.write_text(a.read_text())
    c.write_text('{"x": 2}\n{"x": 1}\n')  # same bytes, other order
    ident = {
        p: run_record.identity(cpu_config(DATA_PATH=str(p)), 2, {"hidden_size": 8, "transformers_version": "5"})
        for p in (a, b, c)
    }
    assert ident[a] == ident[b] and ident[a]["data_sha256"] != ident[c]["data_sha256"]
    other_version = run_record.identity(
        cpu_config(DATA_PATH=str(a)), 2, {"hidden_size": 8, "transformers_version": "6"}
    )
    assert other_version == ident[a] and ident[a]["samples_per_rank_step"] == 8


@pytest.fixture
def checkpoint(tmp_path):
    folder = tmp_path / "step-00000002"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 40)
    (folder / "trainer_state.pt").write_bytes(b"state" * 100)
    run_record.write_manifest(folder)
    return folder


def test_an_intact_checkpoint_has_no_damage(checkpoint):
    assert run_record.damage(checkpoint) is None


@pytest.mark.parametrize(
    "harm,expected",
    [
        (
            lambda f: f.write_bytes(f.read_bytes()[:100]),
            r"adapter_model.safetensors has 100 bytes, the manifest says 10240",
        ),
        (
            lambda f: f.write_bytes(f.read_bytes()[:50] + b"\xff\xfe" + f.read_bytes()[52:]),
            r"does not match its checksum",
        ),
        (lambda f: f.unlink(), r"adapter_model.safetensors is missing"),
        (lambda f: (f.parent / run_record.MANIFEST).unlink(), r"no readable manifest.json"),
    ],
    ids=["truncated", "two-bytes-flipped", "file-missing", "no-manifest"],
)
def test_damage_names_the_file_and_the_problem(checkpoint, harm, expected):
    harm(checkpoint / "adapter_model.safetensors")
    assert re.search(expected, run_record.damage(checkpoint))


def test_a_second_job_is_refused_with_the_holders_identity(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".lock").write_text(
            json.dumps({"host": socket.gethostname(), "pid": holder.pid, "started": "then"})
        )
        with pytest.raises(
            InputError,
            match=rf"in use by another job \(host {socket.gethostname()}, pid {holder.pid}, started then\)",
        ):
            run_record.OutputLock(str(tmp_path)).acquire()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_dead_job_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": "then"}))
    lock = run_record.OutputLock(str(tmp_path))
    lock.acquire()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / ".lock").exists()


def test_a_lock_from_another_host_is_stale_only_when_nobody_refreshes_it(tmp_path):
    path = tmp_path / ".lock"
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "then"}))
    with pytest.raises(InputError, match="in use by another job"):
        run_record.OutputLock(str(tmp_path)).acquire()
    old = time.time() - run_record.OutputLock.STALE_AFTER_S - 1
    os.utime(path, (old, old))
    lock = run_record.OutputLock(str(tmp_path))
    lock.acquire()
    lock.release()
