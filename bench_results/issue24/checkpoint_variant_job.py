"""The real job (train_ddp.main, 1 GPU, no torchrun) with checkpoint_debug.py's variant in place of
train_ddp.add_lora's compiling and checkpointing: frugal compiled on the 12B (MEMORY_TARGET_GIB=25, COMPILE_LAYERS=1,
2,048-token synthetic rows, 8 samples per step, MAX_STEPS=5). Prints the job's step lines.

    python3 bench_results/issue24/checkpoint_variant_job.py [no-early-stop]
"""

import dataclasses
import sys
from pathlib import Path

import torch
from checkpoint_debug import around_compiled_layers
from memory_peak import job_environment

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import train_ddp  # noqa: E402

job_environment(MEMORY_TARGET_GIB="25", COMPILE_LAYERS="1", MAX_STEPS="5")
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
