"""What a run is, and whether a folder on disk belongs to it and is intact.

- `identity()` and `differences()`: the settings and content hashes that decide what a checkpoint's
  weights and data position mean, and what separates a checkpoint's run from this one.
- `write_manifest()` / `damage()`: the size and SHA-256 of every file of a checkpoint, checked before
  anything is loaded, so a truncated or corrupted checkpoint is named instead of half-loaded.
- `OutputLock`: one job per OUTPUT_DIR; a lock left by a dead job is taken over.
"""

import atexit
import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path

# Constants whose change makes a resumed run train differently from the run that wrote the checkpoint.
TRAINING = (
    "MODEL_ID",
    "MODEL_CONFIG",
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
    "SEED",
)
# ... of which these make a checkpoint unusable whatever the user allows: the adapter's shapes, or
# what its position in the data means.
STRUCTURAL = (
    "MODEL_ID",
    "MODEL_CONFIG",
    "model_config_sha256",
    "LORA_R",
    "LORA_TARGETS",
    "world_size",
    "samples_per_rank_step",
)
MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def identity(settings: dict, world_size: int, samples_per_rank_step: int, data_path: str, model_config: dict) -> dict:
    """The values a resumed run must share with the checkpoint's run. The data is identified by its
    content (a copy elsewhere is the same data; a changed file at the same path is not), the model by
    its name and its configuration (transformers' version field left out)."""
    config = {k: v for k, v in model_config.items() if k != "transformers_version"}
    return {
        **{name: settings[name] for name in TRAINING},
        "world_size": world_size,
        "samples_per_rank_step": samples_per_rank_step,
        "data_sha256": sha256_file(Path(data_path)),
        "model_config_sha256": hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest(),
    }


def differences(saved: dict, current: dict) -> list[str]:
    """'NAME: checkpoint X, now Y' for every identity value that differs (structural ones first)."""
    keys = sorted(set(saved) | set(current), key=lambda k: (k not in STRUCTURAL, k))
    return [f"{k}: checkpoint {saved.get(k)!r}, now {current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)]


def write_manifest(folder: Path) -> None:
    files = {
        f.name: {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        for f in sorted(folder.iterdir())
        if f.is_file() and f.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def damage(folder: Path) -> str | None:
    """None if every file of the manifest is there with its size and checksum; else what is wrong."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError) as e:
        return f"no readable {MANIFEST} ({type(e).__name__}): incomplete, or not written by this script"
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {expected['bytes']} (truncated?)"
        if sha256_file(path) != expected["sha256"]:
            return f"{name} does not match its checksum (corrupted)"
    return None


class OutputLock:
    """OUTPUT_DIR/.lock, held by the job's rank 0: host, pid and start time of the holder.

    Taken with O_EXCL, so two jobs can never both hold it. A lock whose holder is gone is taken over:
    on the same host when its pid no longer runs; from another host when its holder has not refreshed
    it (a thread does, every minute) for ten minutes. Released at exit.
    """

    REFRESH_S, STALE_AFTER_S = 60, 600

    def __init__(self, directory: str):
        self.path = Path(directory) / ".lock"
        self.released = threading.Event()
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def acquire(self) -> None:
        """Take the lock, or raise RuntimeError naming the job that holds it."""
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self.holder()
                if holder is not None and not self.is_stale(holder):
                    raise RuntimeError(
                        f"{self.path.parent} is in use by another job (host {holder.get('host')}, "
                        f"pid {holder.get('pid')}, "
                        f"started {holder.get('started')}): use another OUTPUT_DIR, or stop that job. If it is dead on "
                        f"another host, delete {self.path}."
                    ) from None
                try:  # stale: move it aside; of two jobs racing for it, only one rename succeeds
                    self.path.rename(self.path.with_name(f".lock.stale-{os.getpid()}"))
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self.me, f)
            atexit.register(self.release)
            threading.Thread(target=self._refresh, daemon=True, name="output-lock").start()
            return
        raise RuntimeError(f"could not take {self.path}: another job keeps taking it")

    def holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # vanished, or half-written by a job that died while taking it: stale either way

    def is_stale(self, holder: dict) -> bool:
        if holder.get("host") == self.me["host"]:
            try:
                os.kill(int(holder["pid"]), 0)
                return False
            except ProcessLookupError:
                return True
            except PermissionError:
                return False  # it runs, as another user
        return time.time() - self.path.stat().st_mtime > self.STALE_AFTER_S

    def _refresh(self) -> None:
        while not self.released.wait(self.REFRESH_S):
            try:
                os.utime(self.path)
            except OSError:  # gone, or the folder is read-only now
                return

    def release(self) -> None:
        self.released.set()
        if self.holder() == self.me:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:  # read-only now: the lock stays, and the next job takes it over (its pid is gone)
                pass
