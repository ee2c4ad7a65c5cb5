"""Run train_ddp.py on rented GPUs with Modal: torchrun on one "H100:8" container.

    pip install modal && modal setup                                  # once: Modal account and token
    modal run launchers/modal_train.py                                # embedded tiny default, smoke test
    modal run launchers/modal_train.py MODEL_ID=google/gemma-4-12B-it DATA_PATH=chat.jsonl SAVE_EVERY=100

Settings are train_ddp.py's constants as KEY=VALUE arguments; the container passes them to torchrun
as environment variables. DATA_PATH / EVAL_PATH naming a local file upload it into the volume first.
Relative paths are resolved in the volume (`modal volume put gemma4-lora chat.jsonl data/chat.jsonl`
then DATA_PATH=data/chat.jsonl). The Hugging Face cache and OUTPUT_DIR (default out) live in the
volume, so rerunning the same command resumes from the newest checkpoint (RESUME=auto).

Set at definition time, in the local environment:
    MODAL_GPU=A100-80GB:4        another GPU spec; torchrun starts one rank per GPU of it
    MODAL_HF_SECRET=huggingface  a Modal Secret holding HF_TOKEN, for gated models such as Gemma:
                                 modal secret create huggingface HF_TOKEN=hf_...
"""

import os
import subprocess
from pathlib import Path

import modal

GPU = os.environ.get("MODAL_GPU", "H100:8")
HF_SECRET = os.environ.get("MODAL_HF_SECRET", "")  # the embedded default needs no token
VOLUME_NAME = "gemma4-lora"
VOLUME_PATH = "/vol"
APP_DIR = "/root/app"
TIMEOUT_S = 24 * 60 * 60  # Modal's maximum; a longer job continues on a rerun from its last checkpoint
ROOT = Path(__file__).resolve().parent.parent
DATA_SETTINGS = {"DATA_PATH": "data/train", "EVAL_PATH": "data/eval"}  # a local file there: main() uploads it

# PyPI's Linux torch wheel is the CUDA build, so requirements.txt's pins serve the GPUs as they are;
# requirements-gpu.txt adds the global layers' attention kernel (--no-deps, as the file says).
image = (
    modal.Image.debian_slim(python_version="3.11")
    .pip_install_from_requirements(str(ROOT / "requirements.txt"))
    .pip_install_from_requirements(str(ROOT / "requirements-gpu.txt"), extra_options="--no-deps")
)
for module in sorted(ROOT.glob("*.py")):  # all of them: train_ddp.py imports more of its neighbours over time
    image = image.add_local_file(module, f"{APP_DIR}/{module.name}")
for name in ("assets", "configs"):
    image = image.add_local_dir(ROOT / name, f"{APP_DIR}/{name}")

app = modal.App("gemma4-lora", image=image)
volume = modal.Volume.from_name(VOLUME_NAME, create_if_missing=True)


def gpu_count(gpu_spec: str) -> int:
    """GPUs in a Modal GPU spec: "H100:8" -> 8, "H100" -> 1."""
    return int(gpu_spec.split(":")[1]) if ":" in gpu_spec else 1


def torchrun_command(gpu_spec: str, settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command and the environment additions that run train_ddp.py on every GPU of `gpu_spec`."""
    cmd = ["torchrun", "--standalone", f"--nproc_per_node={gpu_count(gpu_spec)}", f"{APP_DIR}/train_ddp.py"]
    env = {"HF_HOME": f"{VOLUME_PATH}/hf", "OUTPUT_DIR": f"{VOLUME_PATH}/out", "PYTHONUNBUFFERED": "1", **settings}
    return cmd, env


def parse_settings(args: tuple[str, ...]) -> dict[str, str]:
    """KEY=VALUE arguments as a dict; anything else is a usage error before a GPU is rented."""
    bad = [arg for arg in args if "=" not in arg or not arg.split("=", 1)[0].isidentifier()]
    if bad:
        raise SystemExit(f"expected KEY=VALUE settings (MODEL_ID=google/gemma-4-12B-it), got {bad}")
    return dict(arg.split("=", 1) for arg in args)


def uploads(settings: dict[str, str]) -> dict[str, str]:
    """{setting: path in the volume} for each of DATA_SETTINGS that names a local file (one folder each:
    a train and an eval file of the same name must not overwrite each other)."""
    return {
        key: f"{folder}/{Path(settings[key]).name}"
        for key, folder in DATA_SETTINGS.items()
        if key in settings and Path(settings[key]).is_file()
    }


@app.function(
    gpu=GPU,
    env={"MODAL_GPU": GPU},  # the container imports this file again: the same spec there sets nproc
    volumes={VOLUME_PATH: volume},
    secrets=[modal.Secret.from_name(HF_SECRET)] if HF_SECRET else [],
    timeout=TIMEOUT_S,
)
def train(settings: dict[str, str]) -> None:
    cmd, env = torchrun_command(GPU, settings)
    try:
        # Output is inherited, so Modal streams every rank's lines; cwd makes relative paths volume paths.
        returncode = subprocess.run(cmd, env={**os.environ, **env}, cwd=VOLUME_PATH).returncode
    finally:
        volume.commit()  # checkpoints of a failed run are kept too: the rerun resumes from them
    if returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited with {returncode}")


@app.local_entrypoint()
def main(*args: str) -> None:
    settings = parse_settings(args)
    files = uploads(settings)
    if files:
        with volume.batch_upload(force=True) as batch:
            for key, remote in files.items():
                batch.put_file(settings[key], remote)
                settings[key] = f"{VOLUME_PATH}/{remote}"
    train.remote(settings)
