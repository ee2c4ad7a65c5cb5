"""TRL's SFTTrainer with packing on the same data, for the ratio in issue 23's table (one GPU):

    python bench_results/issue23/trl_packed.py DATA.jsonl OUT_DIR [--steps 8] [--micro-batch 1] [--accum 8]

The 12B architecture from configs/gemma-4-12b.json with random weights in BF16, the tiny default's tokenizer,
LoRA r=16 alpha=32 dropout 0.05 on train_ddp.py's default targets, packing="bfd" (padding-free rows of 2,048
tokens), SFTConfig's own defaults otherwise (gradient checkpointing on, SDPA). Loss on every token: the tiny
tokenizer's chat template has no generation markers, which TRL's assistant-only loss needs.
Prints one JSON line: non-pad tokens/s over steps 2..N (TRL's num_tokens counter against wall time).
Needs the wheels trl, datasets, dill and multiprocess.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument(
        "--config", default=str(ROOT / "configs" / "gemma-4-12b.json"), help="tiny-gemma4's: a CPU smoke run"
    )
    args = ap.parse_args()

    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from memory_budget import DEFAULT_TARGETS

    times, tokens_at = {}, {}  # per optimizer step: wall time at its end, TRL's cumulative num_tokens

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[state.global_step] = time.perf_counter()

        def on_log(self, _args, state, control, logs=None, **kwargs):
            if logs and "num_tokens" in logs:
                tokens_at[state.global_step] = logs["num_tokens"]

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(args.config), dtype=torch.bfloat16 if cuda else torch.float32
        )
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "assets" / "tiny-gemma4")
    config = SFTConfig(
        output_dir=args.out,
        max_length=2048,
        packing=True,
        packing_strategy="bfd",
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.accum,
        max_steps=args.steps,
        logging_steps=1,
        learning_rate=1e-4,
        report_to="none",
        save_strategy="no",
        dataloader_num_workers=2,
        bf16=cuda,
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=DEFAULT_TARGETS)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=load_dataset("json", data_files=args.data, split="train"),
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[Clock()],
    )
    trainer.train()
    first, last = 1, max(times)
    seconds = times[last] - times[first]
    tokens = tokens_at[last] - tokens_at[first]
    result = {
        "name": "trl-sft-packing-bfd",
        "steps": f"{first + 1}..{last}",
        "non_pad_tok_s": tokens / seconds,
        "step_s": seconds / (last - first),
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
    print(json.dumps(result), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "trl_result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
