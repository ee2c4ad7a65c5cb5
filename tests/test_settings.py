"""settings.py: constants read from the environment, checked all at once, planned and shown by source."""

import dataclasses
import re
import shlex

import pytest

import settings
import train_ddp as T
from guards import InputError


def test_an_override_is_parsed_as_its_defaults_type_and_marked_env():
    cfg, sources = settings.read(T.Config, T.ALLOWED, {"MICRO_BATCH": "4", "LR": "1e-4", "COMPILE_LAYERS": "yes"})
    assert (cfg.MICRO_BATCH, cfg.LR, cfg.COMPILE_LAYERS) == (4, 1e-4, True)
    assert sources["MICRO_BATCH"] == "env" and sources["ACCUM_STEPS"] == "default"
    assert set(sources) == {f.name for f in dataclasses.fields(T.Config)}


def test_every_bad_value_is_named_in_one_error():
    with pytest.raises(InputError) as e:
        settings.read(T.Config, T.ALLOWED, {"MICRO_BATCH": "0", "LR": "abc", "SAVE_ON_SIGTERM": "maybe"})
    assert str(e.value) == (
        "LR='abc': expected a number; SAVE_ON_SIGTERM='maybe': expected 1/0/true/false; MICRO_BATCH=0: allowed >= 1"
    )
    with pytest.raises(InputError) as e:  # an empty path would be read as the working directory
        settings.read(T.Config, T.ALLOWED, {"DATA_PATH": "", "EVAL_PATH": ""})
    assert str(e.value) == "DATA_PATH='': allowed a chat JSONL file"


def test_an_environment_variable_that_looks_like_a_misspelled_constant_is_reported():
    _, sources = settings.read(T.Config, T.ALLOWED, {})
    environ = {
        "MICROBATCH": "4",
        "MICRO_BATCHES_PER_GPU": "4",  # not close enough to be a typo
        "micro_batch": "2",  # in any case
        "LORA_RANK": "8",  # other trainers' names
        "learning_rate": "1e-3",
        "PATH": "/usr/bin",
        "LOCAL_RANK": "0",
        "MAX_LEN": "512",  # the constant itself
    }
    assert [line.split(" is not")[0] + " -> " + line.split()[-1] for line in settings.misspelled(sources, environ)] == [
        "MICROBATCH='4' -> MICRO_BATCH?",
        "micro_batch='2' -> MICRO_BATCH?",
        "LORA_RANK='8' -> LORA_R?",
        "learning_rate='1e-3' -> LR?",
    ]
    assert settings.misspelled(sources, {"MICROBATCH": "4"}) == [
        "MICROBATCH='4' is not a setting of train_ddp.py; did you mean MICRO_BATCH?"
    ]
    # no setting goes by another trainer's name (that would shadow it)
    assert not set(settings.OTHER_NAMES) & set(sources) and set(settings.OTHER_NAMES.values()) <= set(sources)


def test_a_misspelled_constant_stops_the_run_and_is_named_beside_a_bad_value(monkeypatch):
    """GRAD_ACCUM=4 trained with the default ACCUM_STEPS without a word, LORA_RANK=8 with a warning only; and a bad
    value's error (MICRO_BATCH=0) must not hide the typo until a run later."""
    monkeypatch.setenv("LORA_RANK", "8")
    with pytest.raises(InputError) as stopped:
        T.checked_settings()
    assert str(stopped.value) == (
        "LORA_RANK='8' is not a setting of train_ddp.py; did you mean LORA_R? (unset it, or set the constant by its "
        "name)"
    )
    monkeypatch.setenv("GRAD_ACCUM", "4")
    monkeypatch.setenv("MICRO_BATCH", "0")
    with pytest.raises(InputError) as stopped:
        T.checked_settings()
    assert str(stopped.value) == (
        "LORA_RANK='8' is not a setting of train_ddp.py; did you mean LORA_R?; GRAD_ACCUM='4' is not a setting of "
        "train_ddp.py; did you mean ACCUM_STEPS?; MICRO_BATCH=0: allowed >= 1"
    )


def test_the_planners_choices_are_recorded_and_shown_as_planner_with_what_they_replaced():
    asked, asked_sources = settings.read(T.Config, T.ALLOWED, {"LR": "1e-4", "MICRO_BATCH": "1"})
    cfg, sources = settings.planned(asked, asked_sources, {"MICRO_BATCH": 2, "ACCUM_STEPS": 4, "SEED": asked.SEED})
    record = settings.record(cfg, sources, asked, asked_sources)
    assert record["MICRO_BATCH"] == {"value": 2, "source": "planner", "replaced": {"value": 1, "source": "env"}}
    assert record["ACCUM_STEPS"]["replaced"] == {"value": asked.ACCUM_STEPS, "source": "default"}
    assert record["SEED"] == {"value": asked.SEED, "source": "planner"}  # kept as it was: nothing replaced
    assert record["LR"] == {"value": 1e-4, "source": "env"}
    lines = settings.show(record).splitlines()
    assert lines[0] == "settings (env): LR=0.0001"
    accum, seed = asked.ACCUM_STEPS, asked.SEED
    assert lines[1] == f"settings (planner): MICRO_BATCH=2 (env 1) ACCUM_STEPS=4 (default {accum}) SEED={seed}"
    assert lines[2].startswith("settings (default): MODEL_ID=")


def test_the_settings_lines_paste_back_as_the_environment_they_show():
    env = {"OUTPUT_DIR": "/tmp/out 4", "LORA_TARGETS": r".*\.(q_proj|v_proj)", "EVAL_PATH": ""}
    cfg, sources = settings.read(T.Config, T.ALLOWED, env)
    lines = settings.show(settings.record(cfg, sources, cfg, sources)).splitlines()
    (line,) = [line for line in lines if line.startswith("settings (env)")]
    assert dict(word.split("=", 1) for word in shlex.split(line.removeprefix("settings (env): "))) == env


def test_a_regex_that_does_not_compile_is_named():
    settings.check_pattern("LORA_TARGETS", r".*\.(q_proj|v_proj)")
    with pytest.raises(InputError, match=r"LORA_TARGETS='\(q_proj': not a regular expression \(missing \)"):
        settings.check_pattern("LORA_TARGETS", "(q_proj")


def test_peft_all_linear_keyword_is_named_before_the_model_loads():
    """LORA_TARGETS=all-linear (PEFT's keyword, and memory_budget.py --targets') was taken as a regex: after the
    model had loaded it "matches no Linear module", which did not say why."""
    with pytest.raises(InputError) as e:
        settings.check_pattern("LORA_TARGETS", "all-linear")
    assert str(e.value).startswith(
        "LORA_TARGETS='all-linear': PEFT's keyword, not a regular expression; the default already puts LoRA on "
        "every Linear layer of the text decoder"
    )


def test_a_model_of_another_architecture_is_refused_from_its_config(tmp_path, tiny_model_path):
    settings.check_model_source(str(tiny_model_path), "")  # the embedded Gemma 4 passes
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(InputError, match=r"config\.json says model_type 'llama'; this script fine-tunes Gemma 4"):
        settings.check_model_source(str(tmp_path), "")
    with pytest.raises(InputError, match=r"MODEL_CONFIG .* says model_type 'llama'"):
        settings.check_model_source("", str(tmp_path / "config.json"))


@pytest.mark.parametrize(
    "argv, meant",
    [
        (["--lr", "0.5", "--max-steps=3"], "LR=0.5 MAX_STEPS=3"),
        (["MAX_STEPS=1"], "MAX_STEPS=1"),
        (["--learning_rate", "1e-5"], "LR=1e-5"),  # another trainer's name
        (["data.jsonl"], "LR=1e-4 MAX_STEPS=100"),  # nothing it could mean: a generic example
    ],
)
def test_an_argument_fails_with_the_environment_form_of_what_it_seems_to_set(argv, meant):
    """An ignored `--lr 0.5` would train with the default LR and exit 0."""
    with pytest.raises(InputError, match=rf"takes no arguments .* e\.g\. {meant} torchrun --nproc_per_node=N"):
        settings.check_arguments(argv, T.Config, T.__doc__)


def test_help_lists_every_constant_with_its_default_and_exits(capsys):
    with pytest.raises(SystemExit) as e:
        settings.check_arguments(["--help"], T.Config, T.__doc__)
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("LoRA fine-tuning of Gemma 4")
    assert all(f"\n  {f.name}={f.default}\n" in out + "\n" for f in dataclasses.fields(T.Config))
    settings.check_arguments([], T.Config, T.__doc__)  # no arguments: nothing to say


def test_a_value_another_makes_ignored_is_warned_about():
    assert settings.ignored(T.Config(EVAL_EVERY=5)) == ["warning: EVAL_EVERY=5 without EVAL_PATH: nothing to evaluate"]
    assert settings.ignored(T.Config(EVAL_EVERY=5, EVAL_PATH="eval.jsonl")) == []


@pytest.mark.parametrize(
    "name, value, allowed",
    [
        ("WEIGHT_DECAY", "1e6", "in [0, 1]"),  # a slip for 1e-6: AdamW would flip the weights' sign every step
        ("SEED", "99999999999999999999", "in [0, 2**32)"),  # torch.manual_seed's overflow, after the data loaded
        ("DIST_TIMEOUT_S", "100000000000000", "> 0 and at most a week"),  # timedelta's overflow, only after step 1
    ],
)
def test_values_beyond_what_the_run_can_use_are_named(name, value, allowed):
    with pytest.raises(InputError, match=re.escape(f"allowed {allowed}")):
        settings.read(T.Config, T.ALLOWED, {name: value})


def test_an_output_dir_that_is_a_file_is_named_as_such(tmp_path):
    (tmp_path / "out").write_text("")
    with pytest.raises(InputError, match=r"^OUTPUT_DIR '.*out' is a file, not a folder$"):
        settings.check_writable(str(tmp_path / "out"))


def test_a_checkpoints_folder_that_cannot_be_written_is_named_at_start(tmp_path):
    """Found at the first save before: a whole epoch lost (SAVE_EVERY=0), or a FileExistsError traceback."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.symlink_to(tmp_path / "scratch-not-mounted" / "ck")
    with pytest.raises(InputError, match=r"checkpoints links to '.*scratch-not-mounted/ck', which does not exist"):
        settings.check_writable(str(tmp_path))
    checkpoints.unlink()
    checkpoints.write_text("")
    with pytest.raises(InputError, match=r"checkpoints is a file, not a folder$"):
        settings.check_writable(str(tmp_path))
    checkpoints.unlink()
    settings.check_writable(str(tmp_path))  # none yet: made at the first save
    assert list(tmp_path.iterdir()) == []


def test_a_write_probe_that_fails_leaves_nothing_behind(tmp_path, monkeypatch):
    def disk_full(path, text):
        path.touch()  # created, then the write fails, as on a full disk
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(settings.Path, "write_text", disk_full)
    with pytest.raises(InputError, match="is not writable: .*No space left on device"):
        settings.check_writable(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    "env, problem",
    [
        (
            {**MASTER, "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
            r"RANK=2, LOCAL_RANK=0, WORLD_SIZE=2: each rank must be in",
        ),
        (
            {**MASTER, "RANK": "0", "LOCAL_RANK": "-1", "WORLD_SIZE": "2"},
            r"RANK=0, LOCAL_RANK=-1, WORLD_SIZE=2: each rank must be in",
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "1"},
            r"RANK is set but LOCAL_RANK, MASTER_ADDR, MASTER_PORT not: launch with torchrun",
        ),
        ({**MASTER, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "two"}, r"must be integers"),
    ],
)
def test_an_impossible_launch_environment_is_named_before_anything_waits(env, problem):
    with pytest.raises(InputError, match=problem):
        settings.launch_ranks(env)


def test_every_constant_is_in_the_reference_with_its_default():
    """docs/reference.md is where the README sends users for the constants: none missing, no default stale."""
    text = "\n".join(ln for ln in (T.HERE / "docs" / "reference.md").read_text().splitlines() if ln.startswith("| `"))
    for field in dataclasses.fields(T.Config):
        shown = re.search(rf"`{field.name}(=[^`]*)?`", text)
        assert shown, f"{field.name} is not in docs/reference.md"
        if isinstance(field.default, (bool, int, float)):
            assert shown[1] and float(shown[1][1:]) == float(field.default), (field.name, shown[0])
        elif shown[1]:  # a string spelled out: the default, or the end of its path (LORA_TARGETS: described)
            value = shown[1][1:].strip('"')
            assert field.default == value or (value and field.default.endswith("/" + value)), (field.name, shown[0])
