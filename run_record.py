"""What a run is, and whether a folder on disk belongs to it and is intact.

- `identity()` and `differences()`: the settings and content hashes that decide what a checkpoint's
  weights and data position mean, and what separates a checkpoint's run from this one.
- `write_manifest()` / `damage()`: the size and SHA-256 of every file of a checkpoint, checked before
  anything is loaded, so a truncated or corrupted checkpoint is named instead of half-loaded.
- `publish_atomically()`: a checkpoint or adapter folder appears whole or not at all; a failed save says
  why (a full disk, with the space it needed) and keeps the previous one.
- `checkpoint_to_resume()` / `finished()`: which checkpoint a run continues, and whether it is complete (or
  OUTPUT_DIR's adapter is another run's, which a fresh start would replace unasked).
- `OutputLock`: one job per OUTPUT_DIR; a lock left by a dead job is taken over, and so are the
  half-written saves a killed job left (`remove_interrupted_saves()`).
"""

import atexit
import contextlib
import errno
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import threading
import time
from importlib.metadata import version
from pathlib import Path

import torch

from guards import InputError, OutputDirError
from logs import say

# Constants whose change makes a resumed run train differently from the run that wrote the checkpoint.
TRAINING = (
    "MAX_LEN",
    "ASSISTANT_ONLY_LOSS",
    "EPOCHS",
    "MAX_STEPS",
    "LR",
    "WARMUP_STEPS",
    "WEIGHT_DECAY",
    "GRAD_CLIP",
    "LORA_R",
    "LORA_ALPHA",
    "LORA_DROPOUT",
    "LORA_TARGETS",
    "GROUP_BY_LENGTH",
    "PACKING",
    "SEED",
)
# ... of which these make a checkpoint unusable whatever the user allows: the adapter's shapes, or
# what its position in the data means. That position is a count of global batches: step s trains samples
# [s*G, (s+1)*G) of the epoch's order whatever the world size, so another GPU count with the same G resumes.
STRUCTURAL = (
    "MODEL_ID",  # (compared with checkpoints saved before session 21 only: identity()'s "by_path")
    "MODEL_CONFIG",
    "model_config_sha256",
    "model_weights_sha256",
    "LORA_R",
    "LORA_TARGETS",
    "global_batch",
    "PACKING",
)
MANIFEST = "manifest.json"
ADAPTER_FILES = ("adapter_model.safetensors", "run.json")  # what a rerun and a resume read, checksummed
CHECKPOINT_FILES = (*ADAPTER_FILES, "trainer_state.pt")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def identity(run, world_size: int, model_config: dict | None = None, tokenizer_sha256: str = "") -> dict:
    """The values a resumed train_ddp.py run (settings `run`) must share with the checkpoint's run. The data is
    identified by its content (a copy elsewhere is the same data; a changed file at the same path is not), the
    model by its configuration (read from MODEL_CONFIG or MODEL_ID unless given; its path and transformers'
    version left out: the same model moved, or named by another path, is the same model) and the tokenizer by
    `tokenizer_sha256` (chat_data.tokenizer_sha256). The weights join once loaded (weights_sha256)."""
    if model_config is None:
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(run.MODEL_CONFIG or run.MODEL_ID).to_dict()
    config = {k: v for k, v in model_config.items() if k != "transformers_version"}
    named = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    config.pop("_name_or_path", None)
    return {
        **{name: getattr(run, name) for name in TRAINING},
        "global_batch": world_size * run.MICRO_BATCH * run.ACCUM_STEPS,  # samples (packed: rows) per update
        "data_sha256": sha256_file(Path(run.DATA_PATH)),
        "model_config_sha256": hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest(),
        "tokenizer_sha256": tokenizer_sha256,
        # how checkpoints saved before session 21 knew the model (its path; its config hashed with the path)
        "by_path": {"MODEL_ID": run.MODEL_ID, "MODEL_CONFIG": run.MODEL_CONFIG, "model_config_sha256": named},
    }


def weights_sha256(model_id: str) -> str:
    """A fingerprint of MODEL_ID's weights, taken once the model is loaded (a hub model's files are in its cache by
    then): every tensor's name, dtype and shape, and its data (a tensor over 64 KiB: 8 blocks of 4 KiB spread over
    it), in name order: the same tensors however sharded, beside whatever other files. About 12 MiB read for the
    12B; other weights under the same name (another revision, a re-export, a fine-tune) change it. The safetensors
    files, as transformers loads them; else any other weight files, sampled whole."""
    from transformers.utils import cached_file

    folder = Path(cached_file(model_id, "config.json")).parent  # a local folder, or the hub snapshot's
    h = hashlib.sha256()
    tensors = []  # (name, dtype, shape, file, first byte, end)
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, t in header.items():
            if name != "__metadata__":
                tensors.append(
                    (
                        name,
                        t["dtype"],
                        t["shape"],
                        path,
                        8 + size + t["data_offsets"][0],
                        8 + size + t["data_offsets"][1],
                    )
                )
    if not tensors:  # other formats (pytorch_model.bin): each file, as a tensor
        tensors = [(p.name, "", [], p, 0, p.stat().st_size) for p in sorted(folder.glob("*.bin"))]
    for name, dtype, shape, path, first, end in sorted(tensors, key=lambda t: t[0]):
        h.update(f"{name}\0{dtype}\0{shape}\0".encode())
        n = end - first
        blocks = [(first, n)] if n <= 1 << 16 else [(first + k * (n - 4096) // 7, 4096) for k in range(8)]
        with open(path, "rb") as f:
            for start, count in blocks:
                f.seek(start)
                h.update(f.read(count))
    return h.hexdigest()


def check_same_weights(checkpoint: Path, current: dict) -> None:
    """Refuse to continue `checkpoint` on other base weights than its run's (identity `current`, with
    model_weights_sha256): its adapter is a correction to the weights it was trained on. One saved before the
    weights were recorded is not checked."""
    saved = json.loads((checkpoint / "run.json").read_text())["identity"].get("model_weights_sha256")
    now = current["model_weights_sha256"]
    if saved is not None and saved != now:
        raise InputError(
            f"{checkpoint} was trained on other base weights than MODEL_ID's now (model_weights_sha256: checkpoint "
            f"{saved[:16]}, now {now and now[:16]}): its adapter fits the weights it was trained on; resume on those, "
            f"or start fresh with RESUME=''"
        )


def versions(device: torch.device) -> dict:
    """The Python, libraries and GPU this run trained with, saved beside its settings (not part of its identity:
    a resume on a newer transformers is allowed)."""
    gpu = {"cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(device)} if device.type == "cuda" else {}
    return {
        "python": platform.python_version(),
        **{name: version(name) for name in ("torch", "transformers", "peft")},
        **gpu,
    }


def comparable(saved: dict) -> dict:
    """A saved identity as identity() writes it now: one saved before global_batch has its two factors instead."""
    if "world_size" not in saved:
        return saved
    old = ("world_size", "samples_per_rank_step")
    return {
        **{k: v for k, v in saved.items() if k not in old},
        "global_batch": saved["world_size"] * saved["samples_per_rank_step"],
    }


def differences(saved: dict, current: dict, saved_in: str = "checkpoint") -> list[str]:
    """'NAME: checkpoint X, now Y' (or 'adapter X') for every identity value that differs (structural ones first).
    A value the saved identity lacks (recorded only since it was written) is not compared; one saved before
    session 21 knew the model by its path, and is compared as it was then (identity()'s "by_path")."""
    saved = comparable(saved)
    if "MODEL_ID" in saved:
        current = {**current, **current.get("by_path", {})}
    keys = sorted(set(saved) & set(current) - {"by_path"}, key=lambda k: (k not in STRUCTURAL, k))
    return [f"{k}: {saved_in} {saved.get(k)!r}, now {current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)]


def write_manifest(folder: Path) -> None:
    files = {
        f.name: {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        for f in sorted(folder.iterdir())
        if f.is_file() and f.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def damage(folder: Path, needs: tuple[str, ...] = ()) -> str | None:
    """None if every file of the manifest, the `needs` among them, is there with its size and checksum; else
    what is wrong."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
        if not all(isinstance(f, dict) and {"bytes", "sha256"} <= f.keys() for f in files.values()):
            raise ValueError  # valid JSON of another shape: written or edited by something else
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"no readable {MANIFEST} ({type(e).__name__}): incomplete, or not written by this script"
    if unlisted := [name for name in needs if name not in files]:  # an edited manifest: its checksum is gone
        return f"{MANIFEST} does not list {unlisted[0]}"
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["bytes"]:
            size = path.stat().st_size
            why = "truncated, or edited?" if size < expected["bytes"] else "written to after the save, or edited"
            return f"{name} has {size} bytes, the manifest says {expected['bytes']} ({why})"
        if sha256_file(path) != expected["sha256"]:
            return f"{name} does not match its checksum (corrupted, or edited)"
    return None


def save_run_config(output_dir: str, run_config: dict) -> None:
    """OUTPUT_DIR/config.json: the run's effective settings, identity and versions (train_ddp.main's run_config)."""
    try:
        (Path(output_dir) / "config.json").write_text(json.dumps(run_config, indent=1, default=str))
    except OSError as e:  # e.g. a disk that filled since settings.check_writable
        raise InputError(f"OUTPUT_DIR {output_dir!r}: cannot write config.json: {e.strerror}") from e


def progress_of(folder: Path) -> dict:
    """How far the run that wrote `folder` (a checkpoint or the adapter) got: run.json's progress."""
    return json.loads((folder / "run.json").read_text())["progress"]


def write_run_json(folder: Path, run_config: dict, progress: dict) -> None:
    """folder/run.json: the run's settings and identity, and how far it got (read by resume and reruns)."""
    (folder / "run.json").write_text(json.dumps({**run_config, "progress": progress}, indent=1, default=str))


def publish_atomically(final: Path, write_into, expected_bytes: int) -> None:
    """Rank 0 only: write_into(folder) fills a temporary folder, which gets a manifest (size and SHA-256 of
    every file), is fsynced and renamed into place: `final` is the previous complete version or the new
    complete one, never a half-written one. A failed write removes the temporary folder and says why, with
    `expected_bytes` (the tensors': the files are a little more) as what the save needs."""
    tmp, old = final.with_name(f".tmp-{final.name}"), final.with_name(f".old-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write_into(tmp)
        write_manifest(tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as "basic_ios::clear: iostream error"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            free = shutil.disk_usage(final.parent).free
        except OSError:  # the folder vanished
            free = None
        full = getattr(e, "errno", None) == errno.ENOSPC or (free is not None and free < expected_bytes)
        cause = "no space left on the device" if full else str(e).splitlines()[0]
        space = f"{readable_size(free)} free in {final.parent}, " if free is not None else ""
        kept = checkpoints_in(final.parent) if final.name.startswith("step-") else [final] * final.exists()
        raise OutputDirError(
            f"saving {final} failed: {cause} ({space}this save needs over {readable_size(expected_bytes)}); "
            f"the temporary folder is removed"
            + (f" and {kept[-1].name} kept" if kept else "; there is no earlier one to keep")
            + (  # or the next save fails the same way
                "; older checkpoints are pruned only once a new one is whole: KEEP_CHECKPOINTS of them need room "
                "beside it"
                if full and kept and final.name.startswith("step-")
                else ""
            )
        ) from e
    remove(old)  # left over by a crash during an earlier replacement
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    dir_fd = os.open(final.parent, os.O_RDONLY)
    os.fsync(dir_fd)  # make the rename itself durable
    os.close(dir_fd)
    remove(old)  # the previous version: a folder, or a file a user put under that name


def remove(path: Path) -> None:
    """A folder with what is in it, or a file; nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_interrupted_saves(output_dir: Path) -> list[str]:
    """What publish_atomically() leaves when its job is killed mid-save (SIGKILL, a lost node): a half-written
    .tmp-NAME, and, in the instant between its two renames, the previous version as .old-NAME. Called by the
    job that holds OutputLock, so nothing else writes here: each such .tmp- folder is removed (a later save of
    the same name would, but a preemption's step is not saved again), and an .old- one whose NAME is missing is
    put back. Returns what it did, one phrase per folder it removed or put back."""
    done = []
    for folder, name in ((output_dir, "adapter"), (output_dir / "checkpoints", "step-*")):  # only what it writes
        for old in sorted(folder.glob(f".old-{name}")):
            final = old.with_name(old.name.removeprefix(".old-"))
            if final.exists():
                remove(old)
            else:
                old.rename(final)
                done.append(f"{final} put back")
        for tmp in sorted(folder.glob(f".tmp-{name}")):
            shutil.rmtree(tmp)
            done.append(f"{tmp} removed")
    return done


def readable_size(n_bytes: float) -> str:
    """Bytes as a person reads them: 544 KiB, 1.2 MiB, 3.4 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            return f"{n_bytes:,.0f} {unit}" if unit in ("B", "KiB") else f"{n_bytes:,.1f} {unit}"
        n_bytes /= 1024


def final_adapter(run, current: dict) -> tuple[Path, list[str], dict] | None:
    """OUTPUT_DIR's final adapter if it is intact: its folder, how its run differs from this one (identity
    `current`), and the progress it reached; None if there is none."""
    adapter = Path(run.OUTPUT_DIR) / "adapter"
    if not adapter.exists() or adapter_problem(adapter) is not None:
        return None
    return adapter, *adapter_record(adapter, current)


def adapter_record(adapter: Path, current: dict) -> tuple[list[str], dict]:
    """An intact final adapter's run.json: how its run differs from this one (identity `current`), and the
    progress it reached."""
    saved = json.loads((adapter / "run.json").read_text())
    return differences(saved["identity"], current, "adapter"), saved["progress"]


def adapter_problem(adapter: Path) -> str | None:
    """Why OUTPUT_DIR's `adapter` is not a final adapter this script saved, as it saved it (None: it is one)."""
    if not (adapter / "run.json").is_file():
        return "no run.json: another tool's?"
    return damage(adapter, ADAPTER_FILES)


def last_step(run, epoch_steps, progress: dict | None = None, cap: int | None = None) -> int:
    """The step a train_ddp.py run (`run`: its Config; `epoch_steps[e]`: the optimizer steps epoch e holds on the
    current data) ends at when it continues `progress` (a checkpoint's or an adapter's; None: a fresh start): the
    steps taken before the epoch it is in, then the current data's for that epoch and the rest. The data may have
    changed at an epoch boundary (RESUME_ALLOW_CHANGES): the epochs done keep the steps they had. MAX_STEPS caps
    it, or `cap` (0: none)."""
    progress = progress or {"step": 0, "epoch": 0}
    done = progress["step"] - progress.get("step_in_epoch", 0)
    return steps_reached(epoch_steps, range(progress["epoch"], run.EPOCHS), done, run.MAX_STEPS if cap is None else cap)


def steps_reached(epoch_steps, epochs: range, start: int, cap: int) -> int:
    """`start` plus the steps of `epochs` (epoch_steps[e] each), up to `cap` (0: none). Epochs past the cap are
    not read: EPOCHS may be far more than MAX_STEPS lets a run reach, and with PACKING an epoch read is packed."""
    for epoch in epochs:
        if cap and start >= cap:
            break
        start += epoch_steps[epoch]
    return min(start, cap) if cap else start


def finished(run, current: dict, epoch_steps) -> str | None:
    """For a train_ddp.py run (`run`: its Config, read by constant name; identity `current`; `epoch_steps` as
    last_step() takes them) with RESUME=auto: None if it has steps left; else "" when OUTPUT_DIR holds its
    complete adapter, or a note when the data differ from those it was trained on (the run is complete all the
    same)."""
    if run.RESUME != "auto" or (adapter := final_adapter(run, current)) is None:
        return None
    _, changes, progress = adapter
    data = [c for c in changes if c.startswith("data_sha256")]
    if progress["step"] < last_step(run, epoch_steps, progress) or len(changes) > len(data):
        return None
    return f"; DATA_PATH's content differs from the data it was trained on ({run.DATA_PATH})" if data else ""


def prune(checkpoint: Path) -> str | None:
    """Remove an older checkpoint: the files its manifest lists, then its folder. Anything else in it (a user's
    notes) is kept: the folder is moved into set-aside-<time>/ beside it. A symbolic link (the checkpoint moved to
    another disk) is removed, its target kept. Returns the line that says so in those two cases."""
    if checkpoint.is_symlink():
        target = checkpoint.resolve()
        checkpoint.unlink()
        return f"pruned {checkpoint}, a link: what it pointed to ({target}) is kept"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):  # unreadable: nothing listed
        for name in json.loads((checkpoint / MANIFEST).read_text())["files"]:
            if Path(name).name == name:  # a name in this folder, not a path elsewhere
                (checkpoint / name).unlink(missing_ok=True)
    (checkpoint / MANIFEST).unlink(missing_ok=True)
    if not (left := sorted(p.name for p in checkpoint.iterdir())):
        checkpoint.rmdir()
        return None
    aside = checkpoint.parent / time.strftime("set-aside-%Y%m%d-%H%M%S")
    aside.mkdir(exist_ok=True)
    checkpoint.rename(aside / checkpoint.name)
    return f"pruned {checkpoint}, but it held what the job did not write ({', '.join(left[:3])}): moved to {aside}"


def checkpoints_in(folder: Path) -> list[Path]:
    """The checkpoints train_ddp.py wrote in `folder` (step-NNNNNNNN), oldest first. A user's step-latest, step-20
    or step-00000020.bak is neither resumed (names sort: it would pass for the newest) nor pruned."""
    return sorted(p for p in folder.glob("step-*") if re.fullmatch(r"step-\d{8}", p.name))


def how_to_train_longer(run, total_steps: int, epoch_steps) -> str:
    """For a complete run (`run`: train_ddp.py's Config; its adapter in OUTPUT_DIR; `epoch_steps` as last_step()
    takes them): the settings that end it, to raise with RESUME_ALLOW_CHANGES=1, or, with no checkpoint in
    OUTPUT_DIR to continue (a run MAX_STEPS ended mid-epoch leaves only its adapter), that training longer starts
    over."""
    folder = Path(run.OUTPUT_DIR) / "checkpoints"
    if not checkpoints_in(folder):
        return f"it left no checkpoint to continue in {folder}: training longer starts over, with RESUME=''"
    progress = progress_of(Path(run.OUTPUT_DIR) / "adapter")  # the epochs it ran keep their steps (last_step)
    held = last_step(run, epoch_steps, progress, cap=total_steps + 1)  # what EPOCHS hold: more than it took?
    ends = ["a larger MAX_STEPS"] if run.MAX_STEPS and run.MAX_STEPS <= held else []
    ends += ["more EPOCHS"] if total_steps >= held else []
    return f"to train longer, {' and '.join(ends)} with RESUME_ALLOW_CHANGES=1"


def checkpoint_to_resume(run, current: dict, epoch_steps) -> Path | None:
    """The checkpoint a train_ddp.py run (`run`: its Config, read by constant name; identity `current`;
    `epoch_steps` as last_step() takes them; asked once finished() says it is not complete) continues: RESUME's
    path or, with "auto", the newest intact one in OUTPUT_DIR (damaged newer ones are named and skipped); None for
    a fresh start. One written with other settings (see identity()) is named and refused, unless
    RESUME_ALLOW_CHANGES allows the differences; so is a fresh start over the final adapter of another run (or of
    this one, incomplete), unless RESUME='' asks for it."""
    resume = run.RESUME
    if not resume:
        return None
    if resume == "auto":
        found = checkpoints_in(Path(run.OUTPUT_DIR) / "checkpoints")[::-1]  # newest first
        damaged = {path: damage(path, CHECKPOINT_FILES) for path in found}
        for path, problem in damaged.items():
            if problem is None:
                break
            say(f"warning: skipping damaged checkpoint {path}: {problem}")
        else:
            if found:
                raise InputError(
                    f"every checkpoint in {found[0].parent} is damaged (newest: {damaged[found[0]]}); "
                    f"move them away, or start fresh with RESUME=''"
                )
            folder = Path(run.OUTPUT_DIR) / "adapter"
            if folder.exists():  # checked once: the checksums read the whole adapter
                if (problem := adapter_problem(folder)) is not None:
                    raise InputError(
                        f"{folder} is not a final adapter as train_ddp.py saves one ({problem}) and "
                        f"{folder.parent / 'checkpoints'} holds no checkpoint to continue: train from scratch with "
                        f"RESUME='' (it is moved aside, into checkpoints/set-aside-<time>), or use another OUTPUT_DIR"
                    )
                changes, progress = adapter_record(folder, current)
                if progress["step"] < (total_steps := last_step(run, epoch_steps)):
                    changes.append(f"steps: adapter {progress['step']}, now {total_steps}")
                raise InputError(
                    f"{folder} is the final adapter of another run ({'; '.join(changes)}) "
                    f"and {Path(run.OUTPUT_DIR) / 'checkpoints'} holds no checkpoint to continue: train from scratch "
                    f"over it (replacing that adapter) with RESUME='', or use another OUTPUT_DIR"
                )
            return None
    else:
        if (problem := not_a_checkpoint(resume)) is not None:
            raise InputError(problem)
        path = Path(resume)
    saved = json.loads((path / "run.json").read_text())
    changes = differences(saved["identity"], current)
    if saved["progress"].get("step_in_epoch"):  # mid-epoch: the rows left are the rest of the checkpoint's order
        packed = ("MAX_LEN", "tokenizer_sha256") if run.PACKING else ()  # what packs the rows
        order = ("SEED", "data_sha256", "GROUP_BY_LENGTH", *packed)  # the rows' order
        changes = [f"{c} (mid-epoch: cannot change)" if c.split(":")[0] in order else c for c in changes]
    batch = next((c for c in changes if c.startswith("global_batch:")), None)  # another GPU count, say
    fixed = [c for c in changes if c != batch and (c.split(":")[0] in STRUCTURAL or c.endswith("cannot change)"))]
    if batch or fixed or (changes and not run.RESUME_ALLOW_CHANGES):
        allow = "continue it with these changes with RESUME_ALLOW_CHANGES=1, "
        if fixed:
            allow = ""
        elif batch:
            others = len(changes) > 1 and not run.RESUME_ALLOW_CHANGES
            allow = global_batch_advice(
                comparable(saved["identity"])["global_batch"], current["global_batch"], run, others
            )
        raise InputError(
            f"{path} was written with other settings ({'; '.join(changes)}): {allow}start fresh with "
            f"RESUME='', or use another OUTPUT_DIR"
        )
    step, epoch = saved["progress"]["step"], saved["progress"]["epoch"]
    if step > (total_steps := last_step(run, epoch_steps, saved["progress"])) or epoch > run.EPOCHS:
        raise InputError(  # resumed, it would save at once: no step on this data
            f"{path} is at step {step}, {epoch} epoch(s) done, past this run's end (step {total_steps}, EPOCHS="
            f"{run.EPOCHS}; {'; '.join(changes)}): nothing left to train; resume an earlier checkpoint, or start fresh "
            f"with RESUME=''"
        )
    if changes:
        say(f"warning: resuming {path} with changed settings (RESUME_ALLOW_CHANGES=1): {'; '.join(changes)}")
    return Path(os.path.abspath(path))  # as every line names it (a relative path is relative to where the job ran)


def eval_data_changed(checkpoint: Path, eval_sha256: str, eval_path: str) -> str | None:
    """A warning when EVAL_PATH's content (`eval_sha256`) differs from the one the checkpoint's run evaluated on:
    allowed (evaluation does not change training), but the eval curve in metrics.jsonl then mixes two sets."""
    before = json.loads((checkpoint / "run.json").read_text()).get("eval_sha256")  # None: saved before it was kept
    if not before or not eval_sha256 or before == eval_sha256:
        return None
    return (
        f"warning: EVAL_PATH's content ({eval_path}) differs from the one {checkpoint.name} was evaluated on: "
        f"eval_loss from here on is not comparable with the earlier values in metrics.jsonl"
    )


def global_batch_advice(saved: int, now: int, run, others: bool) -> str:
    """How this run's ranks (a train_ddp.py Config `run`) reach a checkpoint's global batch, the way to resume it on
    another number of GPUs (`others`: other changes that need RESUME_ALLOW_CHANGES=1 too). Said as a product:
    MEMORY_TARGET_GIB's planner re-splits MICRO_BATCH and ACCUM_STEPS, keeping it."""
    world = now // (run.MICRO_BATCH * run.ACCUM_STEPS)
    if saved % world:
        fits = [str(n) for n in range(1, min(saved, 1024) + 1) if saved % n == 0]
        return f"its global batch of {saved} splits over {', '.join(fits)} ranks, not {world}: "
    allow = ", with RESUME_ALLOW_CHANGES=1 for the other changes," if others else ""
    return (
        f"on {world} rank{'s' * (world > 1)}, MICRO_BATCH x ACCUM_STEPS = {saved // world} (now {run.MICRO_BATCH} x "
        f"{run.ACCUM_STEPS}){allow} resumes it; or "
    )


def set_aside_later_saves(output_dir: str, start_step: int, resumed: Path | None) -> str | None:
    """Rank 0, once every rank holds the step this run starts from (0: a fresh start; `resumed`: the checkpoint
    it came from, never moved). Checkpoints in OUTPUT_DIR/checkpoints past that step, and a final adapter past
    it, belong to another line of training (an earlier run, or the steps a rollback undoes): RESUME=auto would
    continue them, or call the run complete, rather than continue this one. An OUTPUT_DIR/adapter this script
    did not save as it is (another tool's, or edited since) would be replaced by this run's. They are moved, not
    deleted, into checkpoints/set-aside-<time>/. Returns the line that says so, or None."""

    def step(folder: Path) -> int:  # -1: not a save of this script's naming, or unreadable: left where it is
        if folder.name == "adapter":
            with contextlib.suppress(OSError, ValueError, KeyError):
                return progress_of(folder)["step"]
            return -1
        return int(folder.name[5:]) if re.fullmatch(r"step-\d+", folder.name) else -1

    checkpoints, adapter = Path(output_dir) / "checkpoints", Path(output_dir) / "adapter"
    unsaved = adapter_problem(adapter) if adapter.exists() else None  # named as such, whatever step it claims
    later = [
        p
        for p in [*checkpoints_in(checkpoints), *([adapter] if unsaved is None else [])]
        if step(p) > start_step and not (resumed is not None and p.resolve() == resumed.resolve())
    ]
    moved = later + ([adapter] if unsaved is not None else [])
    if not moved:
        return None
    aside = checkpoints / time.strftime("set-aside-%Y%m%d-%H%M%S")
    aside.mkdir(parents=True)
    for path in moved:
        path.rename(aside / path.name)
    said = []
    if later:
        said.append(f"what another line of training saved past step {start_step} ({', '.join(p.name for p in later)})")
    if unsaved is not None:
        said.append(f"{adapter} ({unsaved})")
    why = "RESUME=auto continues this run" if later else "this run's adapter takes its place"
    return f"{' and '.join(said)} {'were' if len(said) > 1 else 'was'} moved to {aside}: {why}"


def not_a_checkpoint(resume: str) -> str | None:
    """None if the folder RESUME names (`resume`) is an intact checkpoint; else why not, and what to give instead."""
    path, setting = Path(resume), f"RESUME={resume!r}"
    takes = (
        "RESUME takes a checkpoint folder (OUTPUT_DIR/checkpoints/step-N), 'auto' (the newest in OUTPUT_DIR) "
        "or '' (a fresh start)"
    )
    if not path.exists():
        if resume.lower() in ("0", "false", "no", "none", "off"):  # "do not resume", written as a switch
            return (
                f"{setting} is not a switch: for a fresh start, RESUME='' (empty); for the newest checkpoint in "
                f"OUTPUT_DIR, RESUME='auto'; for a given checkpoint, its folder"
            )
        return f"{setting}: no such folder; {takes}"
    if not path.is_dir():
        return f"{setting} is a file, not a checkpoint folder; {takes}"
    if (problem := damage(path, ADAPTER_FILES)) is not None:
        return f"{setting} is not an intact checkpoint folder: {problem}"
    if "trainer_state.pt" not in json.loads((path / MANIFEST).read_text())["files"]:  # (damage() hashed it)
        return (
            f"{setting} is a final adapter, not a checkpoint: it has no trainer_state.pt (no optimizer state, no "
            f"progress), so training cannot continue from it; {takes}"
        )
    return None


def lock_holder(directory: str) -> dict | None:
    """The holder of `directory`'s OutputLock as this process reads it (host, pid, start, process identity); None if
    there is none, or none it can read. At the first collective every rank reads rank 0's there, unless its
    OUTPUT_DIR is another folder (node-local)."""
    try:
        holder = json.loads((Path(directory) / ".lock").read_text())
    except (OSError, ValueError):
        return None  # vanished, or half-written by a job that died while taking it: stale either way
    return holder if isinstance(holder, dict) and "pid" in holder else None  # not this script's: stale too


def process_identity(pid: int) -> str | None:
    """What tells process `pid` apart from any other: its pid namespace (containers on one host may share its
    name, each numbering its own processes), this boot's id and the process's start time (clock ticks since
    boot, /proc/PID/stat's 22nd field: a pid reused is another process). None without /proc."""
    try:
        space = os.readlink(f"/proc/{pid}/ns/pid")
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the name may hold spaces
    except OSError:
        return None
    return f"{space} {boot} {fields[19]}"


class OutputLock:
    """OUTPUT_DIR/.lock, held by the job's rank 0: host, pid and start time of the holder.

    Taken with O_EXCL, so two jobs can never both hold it. A lock whose holder is gone is taken over:
    on the same host (and pid namespace) when its pid no longer runs or now names another process (pids are
    reused: process_identity() tells them apart); from another host, or another container under the same host
    name, when its holder has not refreshed it (a thread does, every minute) for ten minutes.
    Released at exit. Whoever takes it clears the saves a killed job left half-written (remove_interrupted_saves).
    """

    REFRESH_S, STALE_AFTER_S = 60, 600

    def __init__(self, directory: str):
        self.path = Path(directory) / ".lock"
        self.released = threading.Event()
        self.guard = threading.Lock()  # a stop thread's release() waits for a take under way; none follows it
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.me["process"] = process_identity(os.getpid())

    def acquire(self) -> "OutputLock":
        """Take the lock (returns it), or raise InputError naming the job that holds it."""
        for _ in range(3):
            with self.guard:
                if self.released.is_set():  # the job is stopping (a signal): it must not leave a lock behind
                    raise InputError(f"the job was stopped before it took {self.path}")
                try:
                    self._create()
                except FileExistsError:
                    holder = self.holder()
                    if holder is not None and not self.is_stale(holder):
                        raise InputError(
                            f"{self.path.parent} is in use by another job (host {holder.get('host')}, "
                            f"pid {holder.get('pid')}, started {holder.get('started')}): use another OUTPUT_DIR, or "
                            f"stop that job. If it is dead (on another host, or in another container), delete "
                            f"{self.path}, or wait: a lock unrefreshed for {self.STALE_AFTER_S // 60} minutes is "
                            "taken over."
                        ) from None
                    stale = self.path.with_name(f".lock.stale-{os.getpid()}")
                    try:  # stale: move it aside, then drop it; of two jobs racing for it, only one rename succeeds
                        self.path.rename(stale)
                        stale.unlink()
                    except FileNotFoundError:
                        pass
                    continue
            atexit.register(self.release)
            threading.Thread(target=self._refresh, daemon=True, name="output-lock").start()
            if cleared := remove_interrupted_saves(self.path.parent):
                say(f"saves a killed job left half-written: {'; '.join(cleared)}")
            return self
        raise InputError(f"could not take {self.path}: another job keeps taking it")

    def _create(self) -> None:
        """The lock file, whole or not at all (FileExistsError if there is one): written aside, then hard-linked
        into place, so a second job never reads it half-written (and took it for a dead job's). Where the file
        system has no hard links, created empty with O_EXCL, then written."""
        aside = self.path.with_name(f".lock.{os.getpid()}.new")
        aside.write_text(json.dumps(self.me))
        try:
            os.link(aside, self.path)
        except FileExistsError:
            raise
        except OSError:  # no hard links here
            with os.fdopen(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644), "w") as f:
                json.dump(self.me, f)
        finally:
            aside.unlink(missing_ok=True)

    def holder(self) -> dict | None:
        return lock_holder(self.path.parent)

    def is_stale(self, holder: dict) -> bool:
        known, mine = holder.get("process"), self.me["process"]
        elsewhere = known and mine and known.split()[0] != mine.split()[0]  # another pid namespace: its pids
        if holder.get("host") == self.me["host"] and not elsewhere:  # mean nothing here (a container)
            pid = int(holder["pid"])
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass  # it runs, as another user
            now = process_identity(pid)
            return pid == os.getpid() or (known is not None and now is not None and known != now)
        return time.time() - self.path.stat().st_mtime > self.STALE_AFTER_S

    def _refresh(self) -> None:
        while not self.released.wait(self.REFRESH_S):
            try:
                os.utime(self.path)
            except OSError:  # gone, or the folder is read-only now
                return

    def release(self) -> None:
        with self.guard:
            self.released.set()
            if self.holder() == self.me:
                try:
                    self.path.unlink(missing_ok=True)
                except OSError:  # read-only now: the lock stays, and the next job takes it over (its pid is gone)
                    pass
