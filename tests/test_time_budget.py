"""time_budget.py: the arithmetic, the epoch cut as the trainer cuts it, and one run on the tiny model (CPU)."""

import json
import re
import time
from dataclasses import replace

import pytest
import torch
from conftest import SAMPLE_DATA, cpu_config, free_port, usage_error
from transformers import AutoTokenizer

import time_budget as TB
import train_ddp as T
from chat_data import ChatDataset, load_conversations, tokenize_conversation
from collate import PadCollate

SETTINGS = cpu_config(
    SEED=7, MICRO_BATCH=2, ACCUM_STEPS=3, GROUP_BY_LENGTH=True, PAD_TO_MULTIPLE=64, SAVE_EVERY=0, EPOCHS=2, MAX_STEPS=0
)


def test_nearest_rank_quantiles():
    values = list(range(1, 11))
    assert [TB.quantile(values, q) for q in (0.1, 0.5, 0.9, 1.0)] == [1, 5, 9, 10]


def test_interpolation_is_linear_between_and_beyond_the_measured_lengths():
    points = {128: 1.0, 512: 2.0, 2048: 6.0}
    assert TB.interpolate(points, 320) == pytest.approx(1.5)
    assert TB.interpolate(points, 1280) == pytest.approx(4.0)
    assert TB.interpolate(points, 64) == 1.0  # never below the shortest measured: fixed costs remain
    assert TB.interpolate(points, 4096) == pytest.approx(6.0 + 4 * 2048 / 1536)


@pytest.mark.parametrize("group_by_length,packing", [(True, False), (False, False), (True, True)])
def test_the_epoch_is_cut_into_the_micro_batches_the_trainer_runs(group_by_length, packing):
    """Padded widths of every micro-batch of both ranks of 2, against train_ddp.train_loader itself (which
    groups no packed rows by length)."""
    gen = torch.Generator().manual_seed(0)
    tokens = [int(n) for n in torch.randint(20, 700, (53,), generator=gen)]
    keys = [3 * n + 1 for n in tokens]  # the trainer groups by characters; any order-preserving key here
    settings = replace(SETTINGS, GROUP_BY_LENGTH=group_by_length, PACKING=packing, NUM_WORKERS=0)
    dataset = Rows({"input_ids": [1] * n, "labels": [1] * n} for n in tokens)
    dataset.lengths = keys
    for rank in (0, 1):
        loader = T.train_loader(dataset, settings, rank, 2, 0, 0, PadCollate(0, 64))
        widths = [b["input_ids"].shape[1] for b in loader]
        widths = widths[: len(widths) // 3 * 3]  # the trainer stops at the last full accumulation window
        assert TB.epoch_micro_batches(tokens, keys, rank, 2, settings) == widths


class Rows(list):
    """Token rows, with the lengths the trainer's length grouping sorts by (set by the test)."""


def test_epoch_time_adds_micro_batches_the_slowest_rank_the_optimizer_and_the_saves():
    measured = {"micro_batch_s": {64: 0.5, 128: 1.0}, "optimizer_s": 0.1, "save_s": 3.0}
    tokens = [64] * 24
    one = TB.predict(measured, tokens, tokens, SETTINGS, 1, 1, 0.0)
    assert one["steps_per_epoch"] == 4  # 24 rows / (2 x 3) per step
    assert one["epoch_s"] == pytest.approx(4 * (3 * 0.5 + 0.1) + 3.0)  # SAVE_EVERY=0: one save per epoch
    assert one["total_s"] == pytest.approx(2 * one["epoch_s"]) and one["gpu_hours"] == pytest.approx(
        one["total_s"] / 3600
    )
    # two ranks, one of them with the long rows: every step waits for it, and both GPUs are paid for
    mixed = [64 if i % 2 else 128 for i in range(24)]
    two = TB.predict(measured, mixed, mixed, replace(SETTINGS, GROUP_BY_LENGTH=False), 2, 1, 0.0)
    assert two["steps_per_epoch"] == 2 and two["straggler_s"] > 0
    assert two["gpu_hours"] == pytest.approx(2 * two["total_s"] / 3600)
    assert TB.predict(measured, tokens, tokens, replace(SETTINGS, MAX_STEPS=2), 1, 1, 0.0)["total_s"] == pytest.approx(
        one["epoch_s"] / 2
    )  # MAX_STEPS=2 of 4 steps: half an epoch


def test_checkpoints_are_counted_as_the_trainer_writes_them():
    measured = {"micro_batch_s": {64: 0.0}, "optimizer_s": 0.0, "save_s": 1.0}
    tokens = [64] * 24  # 4 steps per epoch
    saves = {
        every: TB.predict(measured, tokens, tokens, replace(SETTINGS, SAVE_EVERY=every), 1, 1, 0.0)["epoch_s"]
        for every in (0, 1, 2, 3, 4)
    }
    assert saves == {0: 1.0, 1: 4.0, 2: 2.0, 3: 2.0, 4: 1.0}  # steps 1..3 by SAVE_EVERY, and the epoch end
    with pytest.raises(ValueError, match="make no optimizer step"):
        TB.predict(measured, tokens[:5], tokens[:5], SETTINGS, 1, 1, 0.0)


def test_an_allreduce_longer_than_the_last_backward_is_exposed():
    measured = {"micro_batch_s": {64: 0.3}, "optimizer_s": 0.0, "save_s": 0.0}
    tokens = [64] * 24
    hidden = TB.predict(measured, tokens, tokens, SETTINGS, 2, 1, allreduce_s=0.1)
    exposed = TB.predict(measured, tokens, tokens, SETTINGS, 2, 1, allreduce_s=0.5)
    assert hidden["allreduce_exposed_s"] == 0
    assert exposed["allreduce_exposed_s"] == pytest.approx(2 * (0.5 - TB.BACKWARD_SHARE * 0.3))


WHOLE_RUN = {  # seconds
    "micro_batch_s": {64: 0.5, 2048: 4.0},  # measured in this order
    "first_step_s": {64: 3 * 0.5 + 20.0, 2048: 3 * 4.0 + 2.0},  # the first carries a 20 s compile
    "forward_s": {64: 0.25},
    "optimizer_s": 0.1,
    "save_s": 1.0,
    "imports_s": 5.0,
    "tokenize_s": 3.0,
    "load_s": 30.0,
    "eval_first_extra_s": 4.0,
    "adapter_save_s": 0.5,
}


@pytest.mark.parametrize("eval_every,evaluations", [(0, (1, 1)), (3, (3, 2)), (4, (2, 1))])
def test_the_whole_run_adds_start_first_steps_training_evaluation_and_the_adapter_save(eval_every, evaluations):
    """24 rows, one of them 2,000 tokens: 2 epochs of 4 steps on 1 rank, of 2 on 2. The first steps: the first
    micro-batch (64 tokens) and both measured lengths' compile extras once. An evaluation every EVAL_EVERY steps
    and at the end, unless the last step just had one. 5 eval rows in micro-batches of 2: 3 on 1 rank, 2 on the
    slower of 2."""
    settings = replace(SETTINGS, EVAL_EVERY=eval_every)
    tokens = [64] * 23 + [2000]
    for ranks, total_steps, eval_batches, runs_eval in zip((1, 2), (8, 4), (3, 2), evaluations, strict=True):
        prediction = TB.predict(WHOLE_RUN, tokens, tokens, settings, ranks, 1, 0.0)
        run = TB.launch_to_adapter(WHOLE_RUN, prediction, tokens, [64] * 5, settings)
        assert prediction["total_steps"] == total_steps and run["training_s"] == prediction["total_s"]
        assert run["start_s"] == pytest.approx(5.0 + 3.0 + 30.0)
        assert run["first_steps_s"] == pytest.approx(0.5 + 20.0 + 2.0)
        assert run["evaluations"] == runs_eval
        assert run["evaluation_s"] == pytest.approx(runs_eval * eval_batches * 0.25 + 4.0)
        assert run["final_save_s"] == 0.5 and run["run_s"] == pytest.approx(
            run["start_s"] + run["first_steps_s"] + run["training_s"] + run["evaluation_s"] + 0.5
        )
    no_eval = TB.launch_to_adapter(WHOLE_RUN, prediction, tokens, [], settings)
    assert no_eval["evaluations"] == 0 and no_eval["evaluation_s"] == 0
    # Kernels are built once per process, not per width: many widths cost no more than one beside the settle's.
    widths = [64] * 12 + list(range(100, 2048, 160))
    many = TB.launch_to_adapter(
        WHOLE_RUN, TB.predict(WHOLE_RUN, widths, widths, settings, 1, 1, 0.0), widths, [], settings
    )
    assert many["first_steps_s"] == pytest.approx(0.5 + 20.0 + 2.0)


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    """A process group of one, gone after the test; torch's thread count as it was (main() may pin it)."""
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }.items():
        monkeypatch.setenv(name, value)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_run_on_the_tiny_model_measures_each_quantile_and_reports(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EVAL_PATH", str(SAMPLE_DATA))  # the training file as eval file: the same quantile lengths
    report = tmp_path / "report.json"
    TB.main(["--gpus-per-node", "1", "2", "16", "--warmup", "0", "--steps", "1", "--json", str(report)])
    out = capsys.readouterr().out
    assert "times do NOT transfer to GPUs" in out and "| 1 x 2 |" in out
    skipped = "skipped 1 x 16 (16 ranks): "  # 96 rows, 16 x 1 x 8 per step: named before measuring, not predicted
    assert out.index(skipped) < out.index("measuring short: ") and "| 1 x 16 |" not in out
    result = json.loads(report.read_text())
    lengths = sorted(result["tokens"])
    expected = {TB.padded(TB.quantile(lengths, q), T.Config.PAD_TO_MULTIPLE) for q in TB.QUANTILES.values()}
    assert {int(n) for n in result["measured"]["micro_batch_s"]} == expected
    one, two = result["predictions"]
    assert one["steps_per_epoch"] == T.steps_per_epoch(len(lengths), 1, T.Config())
    assert two["steps_per_epoch"] == T.steps_per_epoch(len(lengths), 2, T.Config())
    measured = result["measured"]
    assert {int(n) for n in measured["forward_s"]} == expected and measured["load_s"] > 0
    assert measured["adapter_save_s"] > 0 and "launch to adapter" in out
    for prediction in one, two:  # EVAL_EVERY=0: one evaluation, at the end
        whole = prediction["whole_run"]
        assert whole["evaluations"] == 1 and whole["run_s"] > whole["training_s"] + whole["start_s"] > whole["start_s"]


@pytest.fixture
def measured_instantly(monkeypatch) -> list:
    """measure() replaced by WHOLE_RUN's fixed times at each quantile row's width: main()'s report in a moment.
    The list fills with the quantile rows each call was given."""
    given = []

    def measure(run, device, tokenizer, quantile_rows, *args):
        given.append(quantile_rows)
        widths = {TB.padded(len(row["input_ids"]), run.PAD_TO_MULTIPLE) for row in quantile_rows.values()}
        return {
            **WHOLE_RUN,
            "micro_batch_s": dict.fromkeys(widths, 0.5),
            "first_step_s": dict.fromkeys(widths, 2.0),
            "peak_gib": {},
            "oom": [],
        }

    monkeypatch.setattr(TB, "measure", measure)
    return given


def test_a_max_steps_run_says_the_steps_and_epochs_each_configuration_runs(monkeypatch, capsys, measured_instantly):
    monkeypatch.setenv("MAX_STEPS", "20")
    TB.main(["--gpus-per-node", "1", "2"])
    out = capsys.readouterr().out
    one, two = (T.steps_per_epoch(96, ranks, T.Config()) for ranks in (1, 2))
    assert (one, two) == (12, 6)  # EPOCHS=2: MAX_STEPS=20 stops one GPU in its second epoch; two GPUs end first
    assert "modelled, EPOCHS=2 or MAX_STEPS=20 steps, whichever ends first:" in out
    assert "| 1 x 1 | 12 | 20 (1.67) |" in out and "| 1 x 2 | 6 | 12 (2) |" in out


def test_a_count_given_twice_is_one_row_in_the_order_given(tmp_path, capsys, measured_instantly):
    report = tmp_path / "report.json"
    TB.main(["--gpus-per-node", "2", "1", "2", "--nodes", "1", "1", "--json", str(report)])
    out = capsys.readouterr().out
    assert out.count("| 1 x 2 |") == out.count("| 1 x 1 |") == 2  # one row in each table
    assert [p["gpus_per_node"] for p in json.loads(report.read_text())["predictions"]] == [2, 1]


@pytest.mark.parametrize(
    ("rows", "header"),
    [
        (10, "96 rows; lengths of 12 sampled rows (1 in 9, and the one with the most characters) p10"),
        (5000, "96 rows; lengths p10"),  # every row: no sample to name
    ],
)
def test_sampled_lengths_are_said_and_hold_the_longest_conversation(
    rows, header, tmp_path, capsys, tokenizer, measured_instantly
):
    """The longest length's peak memory is measured on the file's longest conversation (by characters, row 17,
    which 1 in 9 misses), and it stands for itself alone in the file modelled."""
    report = tmp_path / "report.json"
    TB.main(["--gpus-per-node", "1", "--rows", str(rows), "--json", str(report)])
    assert header in capsys.readouterr().out
    conversations = load_conversations(str(SAMPLE_DATA))
    chars = ChatDataset(conversations, tokenizer, T.Config.MAX_LEN, True).lengths
    longest = tokenize_conversation(tokenizer, conversations[chars.index(max(chars))], T.Config.MAX_LEN, True)
    (quantile_rows,) = measured_instantly
    assert quantile_rows["longest"]["input_ids"] == longest["input_ids"]
    tokens = json.loads(report.read_text())["tokens"]
    assert len(tokens) == 96 and tokens.count(len(longest["input_ids"])) == 1


def test_a_width_measured_twice_keeps_the_first_step_that_saw_it_new(monkeypatch, tokenizer, sample_data_path):
    """Two quantiles of one padded width (short data): the compile and allocator growth of the very first step
    stay in first_step_s, not the warm first step of the second measurement."""
    calls = []

    def forward_backward(*args):  # 0.3 s the first time the job runs a step, as a compile would; later free
        calls.append(1)
        time.sleep(0.3 if len(calls) == 1 else 0.0)

    monkeypatch.setattr(T, "forward_backward", forward_backward)
    row = tokenize_conversation(tokenizer, load_conversations(str(sample_data_path))[0], 512, True)
    run = cpu_config(MICRO_BATCH=1, ACCUM_STEPS=1)
    measured = TB.measure(run, torch.device("cpu"), tokenizer, {"short": row, "typical": row}, 0, 1, {})
    (width,) = measured["first_step_s"]
    assert len(calls) == 2 and measured["first_step_s"][width] >= 0.3 > measured["micro_batch_s"][width]


def test_packed_rows_are_measured_and_modelled_as_the_trainer_packs_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PACKING", "1")
    monkeypatch.setenv("MAX_LEN", "512")
    monkeypatch.setenv("ACCUM_STEPS", "2")
    report = tmp_path / "report.json"
    TB.main(["--gpus-per-node", "1", "2", "--warmup", "0", "--steps", "1", "--json", str(report)])
    out = capsys.readouterr().out
    run = cpu_config(PACKING=True, MAX_LEN=512, ACCUM_STEPS=2)
    dataset = ChatDataset(load_conversations(str(SAMPLE_DATA)), AutoTokenizer.from_pretrained(run.MODEL_ID), 512, True)
    rows = len(T.epoch_data(dataset, run, 0))
    assert f"packed rows (PACKING=1): 96 rows in {rows} of MAX_LEN" in out and "measuring packed row: 512 tokens" in out
    result = json.loads(report.read_text())
    assert list(result["measured"]["micro_batch_s"]) == ["512"]  # one width: every packed row is MAX_LEN wide
    assert [p["steps_per_epoch"] for p in result["predictions"]] == [T.steps_per_epoch(rows, w, run) for w in (1, 2)]


def test_data_that_fill_no_step_of_any_configuration_stop_it_before_measuring(monkeypatch, capsys, sample_data_path):
    monkeypatch.setenv("DATA_PATH", str(sample_data_path))
    monkeypatch.setattr(TB, "measure", lambda *a: pytest.fail("measured a run that cannot take a step"))
    with pytest.raises(SystemExit) as stop:
        TB.main(["--gpus-per-node", "16", "--nodes", "2"])  # 96 rows; one step of 32 ranks takes 256
    assert str(sample_data_path) in str(stop.value) and "2 x 16" in str(stop.value)
    assert "skipped 2 x 16 (32 ranks): " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("DATA_PATH", "bad.jsonl", r"bad\.jsonl:2: not valid JSON"),
        ("EVAL_PATH", "bad.jsonl", r"bad\.jsonl:2: not valid JSON"),
        ("MICRO_BATCH", "0", r"MICRO_BATCH"),
        ("MODEL_ID", "no-such-model", r"MODEL_ID"),
        ("LORA_TARGETS", "(q_proj", r"LORA_TARGETS"),
    ],
)
def test_bad_input_is_one_line_as_the_trainer_says_it(monkeypatch, tmp_path, sample_data_path, setting, value, message):
    """What the trainer refuses with one line (guards.InputError), time_budget refuses the same way, no traceback."""
    (tmp_path / "bad.jsonl").write_text(sample_data_path.read_text().splitlines()[0] + '\n{"messages": [}\n')
    monkeypatch.setenv("DATA_PATH", str(sample_data_path))
    monkeypatch.setenv(setting, str(tmp_path / value) if value.endswith((".jsonl", "model")) else value)
    monkeypatch.setattr(TB, "measure", lambda *a: pytest.fail("measured with bad input"))
    with pytest.raises(SystemExit) as stop:
        TB.main(["--gpus-per-node", "1"])
    assert re.search(r"^error: .*" + message, str(stop.value)), stop.value


def test_a_missing_model_is_named_before_the_planner_would_read_it(monkeypatch, tmp_path, sample_data_path):
    """MEMORY_TARGET_GIB makes the planner read the model: a wrong MODEL_ID is the trainer's one line first."""
    monkeypatch.setenv("DATA_PATH", str(sample_data_path))
    monkeypatch.setenv("MODEL_ID", str(tmp_path / "no-such-model"))
    monkeypatch.setenv("MEMORY_TARGET_GIB", "130")
    monkeypatch.setattr(TB, "measure", lambda *a: pytest.fail("measured with bad input"))
    with pytest.raises(SystemExit) as stop:
        TB.main(["--gpus-per-node", "1"])
    assert re.match(r"error: MODEL_ID '\S+no-such-model': no such folder", str(stop.value)), stop.value


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus-per-node", "0"], "--gpus-per-node: must be an integer >= 1 (got 0)"),
        (["--gpus-per-node", "1", "-2"], "--gpus-per-node: must be an integer >= 1 (got -2)"),
        (["--nodes", "0"], "--nodes: must be an integer >= 1 (got 0)"),
        (["--rows", "0"], "--rows: must be an integer >= 1 (got 0)"),
        (["--bus-bw-gbps", "0"], "--bus-bw-gbps: must be a number > 0 (got 0)"),
        (["--bus-bw-gbps", "-1"], "--bus-bw-gbps: must be a number > 0 (got -1)"),
        (["--steps", "0"], "--steps: must be an integer >= 1 (got 0)"),
        (["--warmup", "-1"], "--warmup: must be an integer >= 0 (got -1)"),
        (["--json", "/no/such/x.json"], "--json: cannot write /no/such/x.json: No such file or directory"),
        (["--json", "/"], "--json: cannot write /: Is a directory"),
    ],
)
def test_bad_options_are_a_usage_error_before_anything_runs(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(TB, "report", lambda *a: pytest.fail("ran with a bad command line"))
    err = usage_error(TB.main, argv, capsys)
    assert f"error: argument {message}" in err, err


class Measuring(Exception):
    """Raised where main() starts measuring: what it set up by then is checked, nothing is run."""


@pytest.mark.parametrize("omp_num_threads", [None, "3"])
def test_on_the_cpu_threads_are_one_as_torchrun_sets_them_unless_omp_num_threads_says(
    omp_num_threads, monkeypatch, capsys
):
    if omp_num_threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp_num_threads)  # read by torch at start: here it only says "leave it"
    torch.set_num_threads(3)
    seen = []

    def measure(*args):
        seen.append(torch.get_num_threads())
        raise Measuring

    monkeypatch.setattr(TB, "measure", measure)
    with pytest.raises(Measuring):
        TB.main(["--gpus-per-node", "1"])
    pinned = "CPU: 1 thread, as torchrun gives each rank" in capsys.readouterr().out
    assert (seen, pinned) == (([1], True) if omp_num_threads is None else ([3], False))
