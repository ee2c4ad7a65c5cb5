"""The real job (train_ddp.main, 1 GPU, no torchrun) with checkpoint_debug.py's variant in place of
train_ddp.add_lora's compiling and checkpointing: frugal compiled on the 12B (MEMORY_TARGET_GIB=25, COMPILE_LAYERS=1,
2,048-token synthetic rows, 8 samples per step, MAX_STEPS=5). Prints the job's step lines.

    python3 bench_results/issue24/checkpoint_variant_job.py [no-early-stop]
"""

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import torch
from checkpoint_debug import around_compiled_layers

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import bench  # noqa: E402
import train_ddp  # noqa: E402

work = Path(tempfile.mkdtemp(prefix="variant-"))
bench.synthetic_conversations(work / "rows.jsonl", n=96, min_words=4096)
os.environ.update(
    MODEL_CONFIG=str(REPO / "configs" / "gemma-4-12b.json"),
    MODEL_ID=str(REPO / "assets" / "tiny-gemma4"),
    DATA_PATH=str(work / "rows.jsonl"),
    OUTPUT_DIR=str(work / "out"),
    MAX_LEN="2048",
    ASSISTANT_ONLY_LOSS="0",
    MAX_STEPS="5",
    EPOCHS="1000",
    MICRO_BATCH="1",
    ACCUM_STEPS="8",
    DRIFT_CHECK_EVERY="0",
    RESUME="",
    MEMORY_TARGET_GIB="25",
    COMPILE_LAYERS="1",
)
original = train_ddp.add_lora


def add_lora(model, cfg):
    peft_model = original(model, dataclasses.replace(cfg, GRADIENT_CHECKPOINTING=0, COMPILE_LAYERS=False))
    around_compiled_layers(peft_model, cfg)
    return peft_model


train_ddp.add_lora = add_lora
if sys.argv[1:] == ["no-early-stop"]:
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        train_ddp.main()
else:
    train_ddp.main()
