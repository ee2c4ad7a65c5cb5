"""logs.py: what reaches metrics.jsonl and TensorBoard, and the rank-0 print."""

import json
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, writes_to

import logs


def test_metrics_also_reach_tensorboard_when_it_is_installed(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = logs.StepLog(str(tmp_path), 1, 2, 0, torch.device("cpu"), predict_peak_gib=None)
    log.write({"step": 1, "loss": 2.5, "skipped": False, "lr": 1e-4})
    log.write({"step": 2, "loss": 2.25, "skipped": False, "lr": 2e-4})
    for what in ("checkpoint", "adapter"):  # the last step saves twice: one curve each
        log.saved(2, what, since=time.perf_counter())
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert sorted(events.Tags()["scalars"]) == ["loss", "lr", "save_s/adapter", "save_s/checkpoint"]  # numbers only
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 2.5), (2, 2.25)]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 4


def test_a_metrics_line_the_disk_cannot_hold_is_not_left_half_written(tmp_path):
    """The file size limit stands in for a full disk: the write fails part way, and the error names the file
    (so the job reports it as OUTPUT_DIR's failure, in one line)."""
    script = f"""
import resource, signal, sys, torch
sys.path.insert(0, {str(logs.__file__.rsplit("/", 1)[0])!r})
import logs
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
log = logs.StepLog({str(tmp_path)!r}, 1, 2, 0, torch.device("cpu"), predict_peak_gib=None)
log.write({{"step": 1, "loss": 2.5}})
resource.setrlimit(resource.RLIMIT_FSIZE, (40, 40))
try:
    log.write({{"step": 2, "loss": 2.25, "note": "x" * 100}})
except OSError as e:
    print(e.filename)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == str(tmp_path / "metrics.jsonl"), out.stderr[-2000:]
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.5}\n'


def test_a_step_is_logged_every_log_every_steps_and_at_the_last(tmp_path):
    log = logs.StepLog(str(tmp_path), 3, 7, 0, torch.device("cpu"), predict_peak_gib=None)
    batch = {"input_ids": torch.zeros(2, 64)}
    for step in range(1, 8):
        log.step(step, 0, 10.0, (5.0, 100.0, 128.0), 1.5, 1e-4, None, 0.5, 0.01, [batch])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6, 7]
    assert records[0]["loss"] == 2.0 and records[0]["tokens_per_s"] == 200.0 and records[0]["padding"] == 0.21875


def test_a_skipped_update_is_logged_whatever_log_every_and_summed_up_at_the_end(tmp_path, capsys):
    log = logs.StepLog(str(tmp_path), 10, 30, 0, torch.device("cpu"), predict_peak_gib=None)
    batch = {"input_ids": torch.zeros(2, 64)}
    skipped = {3: "non-finite loss or gradient; NAN_POLICY=skip", 12: "no target token"}
    skipped[17] = skipped[3]
    for step in range(1, 31):
        targets = 0.0 if step == 12 else 5.0
        log.step(step, 0, 10.0, (targets, 100.0, 128.0), 1.5, 1e-4, skipped.get(step), 0.5, 0.01, [batch])
    log.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["skipped"], r["loss"]) for r in records] == [
        (3, True, 2.0),
        (10, False, 2.0),
        (12, True, None),  # no target, no loss (not 0)
        (17, True, 2.0),
        (20, False, 2.0),
        (30, False, 2.0),
    ]
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "warning: 2 of 30 steps skipped their update (non-finite loss or gradient; NAN_POLICY=skip): steps 3, 17",
        "warning: 1 of 30 steps skipped their update (no target token): steps 12",
    ]


def test_only_rank_0_prints(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    logs.say("from rank 1")
    monkeypatch.setenv("RANK", "0")
    logs.say("from rank 0")
    assert capsys.readouterr().out == "from rank 0\n"


def test_a_line_reaches_stdout_in_one_write_with_its_newline(monkeypatch):
    """Seen in CI: rank 1's error line landed between rank 0's step line and its newline, so it did not
    start a line."""
    monkeypatch.setenv("RANK", "0")
    writes = writes_to(monkeypatch, "stdout")
    logs.say("step 6 | loss nan")
    assert writes == ["step 6 | loss nan\n"]


def test_the_last_lines_name_only_files_that_exist_and_load_the_adapter_on_the_weights_it_trained_on(
    tmp_path, monkeypatch
):
    adapter = tmp_path / "adapter"
    model = "google/gemma-4-12B-it"
    lines = logs.where_everything_is(str(tmp_path), adapter, model, "").splitlines()
    assert "checkpoints:" not in lines[0]  # none saved (MAX_STEPS before an epoch's end, SAVE_EVERY=0)
    base = f"AutoModelForCausalLM.from_pretrained('{model}')"
    assert lines[1] == f"load it: PeftModel.from_pretrained({base}, '{adapter}')"
    (tmp_path / "checkpoints").mkdir()
    lines = logs.where_everything_is(str(tmp_path), adapter, model, "configs/12b.json").splitlines()
    assert f"checkpoints: {tmp_path / 'checkpoints'}" in lines[0]
    assert lines[1].startswith("trained on random weights built from MODEL_CONFIG='configs/12b.json'")
    monkeypatch.chdir(tmp_path)  # a relative OUTPUT_DIR is named as found from anywhere
    assert f"metrics: {tmp_path / 'run' / 'metrics.jsonl'} " in logs.where_everything_is("run", adapter, model, "")


def test_packed_steps_log_their_fill(tmp_path):
    log = logs.StepLog(str(tmp_path), 1, 1, 0, torch.device("cpu"), predict_peak_gib=None, packed_slots=4 * 512)
    log.step(1, 0, 10.0, (5.0, 1536.0, 2048.0), 1.5, 1e-4, None, 0.5, 0.01, [{"input_ids": torch.zeros(4, 512)}])
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["fill"] == 0.75


def test_seconds_since_launch_counts_from_the_process_start_not_from_the_import(tmp_path):
    """A process that sleeps 1.5 s before it imports logs reports at least that, and no more than its whole life."""
    began = time.monotonic()
    age = subprocess.run(
        [sys.executable, "-c", "import time; time.sleep(1.5); import logs; print(logs.seconds_since_launch())"],
        cwd=logs.__file__.rsplit("/", 1)[0],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 1.5 <= float(age) <= time.monotonic() - began + 0.05


LOST_TERMINAL = """
import os, sys
sys.path.insert(0, sys.argv[1])
import guards, logs
r, w = os.pipe()
os.close(r)  # the reader is gone: every write fails (EPIPE), as a closed terminal's fail with EIO
for fd in (1, 2):
    os.dup2(w, fd)
logs.say("step 2 | loss 1.0")
guards.to_stderr("[rank 0] a report")
logs.say("stopped by SIGHUP after step 2: saved")
with open(sys.argv[2], "w") as f:
    f.write("went on")
"""


def test_lines_to_a_lost_terminal_do_not_fail_the_job(tmp_path):
    """After SIGHUP the terminal is gone: the step and its checkpoint must not fail on a print."""
    went_on = tmp_path / "went_on"
    rank = subprocess.run([sys.executable, "-c", LOST_TERMINAL, str(ROOT), str(went_on)], timeout=60)
    assert rank.returncode == 0 and went_on.read_text() == "went on"
