"""train_ddp.py's constants as one run uses them: read from the environment, checked, planned, shown.

- check_arguments(): train_ddp.py takes no command-line arguments (--help lists the constants): an argument
  like `--lr 0.5` or `MAX_STEPS=1` after the script would be ignored, so it fails, saying how to set it.
- ignored(): a warning for a value another one makes ignored (EVAL_EVERY without EVAL_PATH).
- read(): each constant's environment variable, parsed as its default's type, and where each value came
  from; every unparsable or disallowed value at once, as one InputError (before any collective).
- misspelled(): environment variables that look like a misspelled constant (MICROBATCH, micro_batch) or
  name one the way other trainers do (LEARNING_RATE).
- planned(): the same settings with the planner's choices, marked as such.
- launch_ranks(): rank, local rank and world size from torchrun's variables, a partial or impossible set named.
- check_model_source(), check_pattern(), check_writable(): a missing model or one of another architecture, a
  regex that does not compile, an unwritable OUTPUT_DIR: each fails at once, before anything slow.
- record(), show(): the settings grouped by source, printed once and saved with the run.
"""

import contextlib
import dataclasses
import difflib
import json
import os
import re
import shlex
import socket
from pathlib import Path

from guards import InputError
from memory_budget import GEMMA4_MODEL_TYPES

BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def parse(raw: str, default):
    """`raw` as the type of `default`; ValueError says what was expected."""
    if isinstance(default, bool):
        if raw.lower() not in BOOLEANS:
            raise ValueError("expected 1/0/true/false")
        return BOOLEANS[raw.lower()]
    try:
        return type(default)(raw)
    except ValueError:
        raise ValueError(f"expected {'an integer' if isinstance(default, int) else 'a number'}") from None


def check_arguments(argv: list[str], constants: type, doc: str) -> None:
    """`--help`: the script's doc and every constant with its default, then exit. Any other argument fails with
    the environment form of what it seems to set (`--lr 0.5`, `--max-steps=3`, `MAX_STEPS=3` -> `LR=0.5 ...`)."""
    if not argv:
        return
    names = [field.name for field in dataclasses.fields(constants)]
    if "-h" in argv or "--help" in argv:
        defaults = "\n".join(f"  {field.name}={field.default}" for field in dataclasses.fields(constants))
        print(
            f"{doc.strip()}\n\nSettings (NAME=value in the environment; the defaults, described in Config):\n{defaults}"
        )
        raise SystemExit(0)
    meant, words = [], list(argv)
    while words:
        word = words.pop(0)
        key, _, value = word.lstrip("-").partition("=")
        if word.startswith("--") and not value and words and not words[0].startswith("-"):
            value = words.pop(0)  # --lr 0.5
        name = key.upper().replace("-", "_")
        name = OTHER_NAMES.get(name, name)
        close = [name] if name in names else difflib.get_close_matches(name, names, n=1, cutoff=0.85)
        if close and value:
            meant.append(f"{close[0]}={shlex.quote(value)}")
    example = " ".join(meant) or "LR=1e-4 MAX_STEPS=100"
    raise InputError(
        f"train_ddp.py takes no arguments (got {shlex.join(argv)}): settings are environment variables, set "
        f"before the command, e.g. {example} torchrun --nproc_per_node=N train_ddp.py "
        f"(python train_ddp.py --help lists them)"
    )


def read(constants: type, allowed: dict, environ=os.environ) -> tuple:
    """(constants(...) with every field its environment variable overrides, {name: "default" or "env"}).
    `allowed` maps a name to (test, text) for values its type admits but the run does not."""
    values, sources, unparsable = {}, {}, []
    for field in dataclasses.fields(constants):
        raw = environ.get(field.name)
        sources[field.name] = "default" if raw is None else "env"
        if raw is not None:
            try:
                values[field.name] = parse(raw, field.default)
            except ValueError as e:
                unparsable.append(f"{field.name}={raw!r}: {e}")
    bad = unparsable + [
        f"{name}={values[name]!r}: allowed {text}"
        for name, (ok, text) in allowed.items()
        if name in values and not ok(values[name])
    ]
    if bad:
        raise InputError("; ".join(bad))
    return constants(**values), sources


# what other trainers (transformers' TrainingArguments, PEFT, torchtune) call some of train_ddp.py's constants
OTHER_NAMES = {
    "LEARNING_RATE": "LR",
    "LORA_RANK": "LORA_R",
    "TARGET_MODULES": "LORA_TARGETS",
    "LORA_TARGET_MODULES": "LORA_TARGETS",
    "BATCH_SIZE": "MICRO_BATCH",
    "PER_DEVICE_TRAIN_BATCH_SIZE": "MICRO_BATCH",
    "GRADIENT_ACCUMULATION_STEPS": "ACCUM_STEPS",
    "GRAD_ACCUM_STEPS": "ACCUM_STEPS",
    "NUM_EPOCHS": "EPOCHS",
    "NUM_TRAIN_EPOCHS": "EPOCHS",
    "MAX_SEQ_LEN": "MAX_LEN",
    "MAX_SEQ_LENGTH": "MAX_LEN",
    "MAX_LENGTH": "MAX_LEN",
    "MAX_GRAD_NORM": "GRAD_CLIP",
    "MODEL_NAME": "MODEL_ID",
    "MODEL_NAME_OR_PATH": "MODEL_ID",
    "DATASET_PATH": "DATA_PATH",
    "TRAIN_FILE": "DATA_PATH",
    "EVAL_FILE": "EVAL_PATH",
    "SAVE_STEPS": "SAVE_EVERY",
    "EVAL_STEPS": "EVAL_EVERY",
    "LOGGING_STEPS": "LOG_EVERY",
    "WARMUP": "WARMUP_STEPS",
    "GRAD_ACCUM": "ACCUM_STEPS",
}


def misspelled(sources: dict, environ=os.environ) -> list[str]:
    """A line for each environment variable that is not a constant but looks like one, in any case, or is
    another trainer's name for one (OTHER_NAMES): its value would be ignored, the default trained with."""
    warnings = []
    for var in environ:
        if var in sources:
            continue
        other = OTHER_NAMES.get(var.upper())
        close = [other] if other in sources else difflib.get_close_matches(var.upper(), sources, n=1, cutoff=0.85)
        if close:
            warnings.append(f"{var}={environ[var]!r} is not a setting of train_ddp.py; did you mean {close[0]}?")
    return warnings


def ignored(run) -> list[str]:
    """A warning for each value that another makes ignored (`run`: train_ddp.py's Config, read by constant
    name)."""
    warnings = []
    if run.EVAL_EVERY and not run.EVAL_PATH:
        warnings.append(f"warning: EVAL_EVERY={run.EVAL_EVERY} without EVAL_PATH: nothing to evaluate")
    return warnings


def planned(values, sources: dict, chosen: dict) -> tuple:
    """(values with the planner's `chosen` constants, sources with those marked "planner")."""
    return dataclasses.replace(values, **chosen), {**sources, **dict.fromkeys(chosen, "planner")}


def record(values, sources: dict, asked, asked_sources: dict) -> dict:
    """Every constant as this run uses it, with where its value came from; one the planner changed keeps what
    it replaced ("replaced": the value and source of `asked`/`asked_sources`, the settings before planning)."""
    settings = {name: {"value": getattr(values, name), "source": source} for name, source in sources.items()}
    for name, s in settings.items():
        if s["value"] != getattr(asked, name):
            s["replaced"] = {"value": getattr(asked, name), "source": asked_sources[name]}
    return settings


def show(settings: dict) -> str:
    """The constants grouped by source, so what the user and the planner chose stands out (a planner's choice
    with what it replaced: `MICRO_BATCH=4 (env 1)`). Values are quoted as a shell would need them (a path with a
    space, a regex), so a line pastes back as the environment it shows."""

    def shown(name: str, s: dict) -> str:
        was = s.get("replaced")
        return f"{name}={shlex.quote(str(s['value']))}" + (
            f" ({was['source']} {shlex.quote(str(was['value']))})" if was else ""
        )

    lines = []
    for source in ("env", "planner", "default"):
        chosen = [shown(name, s) for name, s in settings.items() if s["source"] == source]
        if chosen:
            lines.append(f"settings ({source}): {' '.join(chosen)}")
    return "\n".join(lines)


def check_pattern(name: str, pattern: str) -> None:
    """A regular expression setting (LORA_TARGETS) that does not compile, or PEFT's "all-linear" keyword (a regex
    matching nothing), fails with the checks, not after the model has loaded."""
    if pattern.strip().lower() == "all-linear":
        raise InputError(
            f"{name}={pattern!r}: PEFT's keyword, not a regular expression; the default already puts LoRA on every "
            f"Linear layer of the text decoder (q/k/v/o/gate/up/down_proj); all-linear would add the vision and "
            f"audio embedders', which text rows never run (DDP fails at step 2: repro/02_unused_parameters.py)"
        )
    try:
        re.compile(pattern)
    except re.error as e:
        raise InputError(
            f"{name}={pattern!r}: not a regular expression ({e}); PEFT full-matches it against module names, "
            r"e.g. '.*language_model.*\.(q_proj|v_proj)'"
        ) from None


LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # torchrun sets them all


def launch_ranks(environ) -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from the launcher's variables in `environ`. A partial or impossible set (a
    leftover RANK export, RANK >= WORLD_SIZE) would fail late, or wait for ranks that never come."""
    if missing := [name for name in LAUNCHER_VARIABLES if not environ.get(name)]:
        raise InputError(
            f"RANK is set but {', '.join(missing)} not: launch with torchrun (it sets all of "
            f"{', '.join(LAUNCHER_VARIABLES)}), or unset RANK to train as one process"
        )
    try:
        rank, local_rank, world = (int(environ[name]) for name in LAUNCHER_VARIABLES[:3])
    except ValueError:
        raise InputError(
            f"RANK, LOCAL_RANK and WORLD_SIZE must be integers: {environ['RANK']!r}, {environ['LOCAL_RANK']!r}, "
            f"{environ['WORLD_SIZE']!r}"
        ) from None
    if not (0 <= rank < world and 0 <= local_rank < world):
        raise InputError(
            f"RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world}: each rank must be in [0, WORLD_SIZE) "
            f"(this rank would wait for the process group until DIST_INIT_TIMEOUT_S)"
        )
    return rank, local_rank, world


def check_model_source(model_id: str, model_config: str) -> None:
    """A model folder that does not exist, or a hub id that is not cached while offline, fails at once
    (transformers would try the hub for either, and wait on the network); so does a config.json of
    another architecture (this script's loss, attention and LoRA targets are Gemma 4's)."""
    if model_config:
        if not Path(model_config).is_file():
            raise InputError(f"MODEL_CONFIG {model_config!r}: no such file")
        return check_architecture("MODEL_CONFIG", model_config, Path(model_config))
    if Path(model_id).exists():
        return check_architecture("MODEL_ID", model_id, Path(model_id) / "config.json")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model_id) or model_id.startswith("."):
        raise InputError(f"MODEL_ID {model_id!r}: no such folder (a hub id looks like google/gemma-4-12B-it)")
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(cached := try_to_load_from_cache(model_id, "config.json"), str):
        return check_architecture("MODEL_ID", model_id, Path(cached))
    if constants.HF_HUB_OFFLINE:
        raise InputError(
            f"MODEL_ID {model_id!r}: not in the local hub cache, and HF_HUB_OFFLINE is set: download "
            f"it first (hf download {model_id}) or point MODEL_ID to a local folder"
        )
    try:  # one quick question to the hub, instead of transformers' retries on an unreachable one
        HfApi().model_info(model_id, timeout=10)
    except RepositoryNotFoundError:
        raise InputError(f"MODEL_ID {model_id!r}: no such folder here, and no such model on the hub") from None
    except Exception as e:  # network errors: httpx's, requests', OSError
        raise InputError(
            f"MODEL_ID {model_id!r}: no such folder here, and the hub did not answer ({type(e).__name__}: {e}); "
            f"check the path, or the network (HF_HUB_OFFLINE=1 uses a cached copy)"
        ) from None


def check_writable(directory: str) -> None:
    """OUTPUT_DIR, and its checkpoints/ where there is one (a link to scratch that is not mounted, a file, a
    read-only mount), can be written: said at start, not at the first save after an epoch of training."""
    checkpoints = Path(directory) / "checkpoints"
    for folder, name in ((Path(directory), f"OUTPUT_DIR {directory!r}"), (checkpoints, str(checkpoints))):
        if folder.is_symlink() and not folder.exists():
            raise InputError(f"{name} links to {os.readlink(folder)!r}, which does not exist (not mounted?)")
        if folder.exists() and not folder.is_dir():
            raise InputError(f"{name} is a file, not a folder")
        if folder == checkpoints and not folder.exists():
            return  # made at the first save
        probe = folder / f".write_probe_{socket.gethostname()}_{os.getpid()}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe.write_text("ok")
        except OSError as e:
            raise InputError(f"{name} is not writable: {e}") from e
        finally:
            with contextlib.suppress(OSError):  # a full disk can leave the empty file behind
                probe.unlink()


def check_architecture(name: str, value: str, config_json: Path) -> None:
    try:
        model_type = json.loads(config_json.read_text()).get("model_type")
    except (OSError, ValueError) as e:
        raise InputError(f"{name} {value!r}: cannot read {config_json} ({type(e).__name__}: {e})") from None
    if model_type not in GEMMA4_MODEL_TYPES:
        raise InputError(
            f"{name} {value!r}: {config_json.name} says model_type {model_type!r}; this script fine-tunes Gemma 4 "
            f"({', '.join(GEMMA4_MODEL_TYPES)}), e.g. google/gemma-4-12B-it"
        )
