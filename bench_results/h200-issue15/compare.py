"""Predicted (time_budget.predict, from call4/predicted.json's measurements) vs measured (call4's real runs).

    .venv/bin/python bench_results/h200-issue15/compare.py

Rebuilds call4.sh's data (same generator, same seed) and tokenizer (the tiny default's), so the epoch is cut
exactly as the trainer cut it; settings are the ones the planner printed in call4/run_1gpu.log."""

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from transformers import AutoTokenizer  # noqa: E402

import memory_budget  # noqa: E402
import time_budget  # noqa: E402
import train_ddp as T  # noqa: E402
from chat_data import ChatDataset, tokenize_conversation  # noqa: E402

rng, words = random.Random(0), "gradient token rank batch memory network device update adapter sequence value".split()
conversations = []
for i in range(256):
    n = max(8, min(3000, int(rng.lognormvariate(5.5, 0.8))))
    answer = " ".join(rng.choice(words) for _ in range(n))
    conversations.append([{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": answer}])
tokenizer = AutoTokenizer.from_pretrained(T.Config.MODEL_ID)
tokens = [len(tokenize_conversation(tokenizer, c, 2048, True)["input_ids"]) for c in conversations]
group_keys = ChatDataset(conversations, tokenizer, 2048, True).lengths
settings = T.Config(
    SEED=1234,
    MICRO_BATCH=2,
    ACCUM_STEPS=4,
    GROUP_BY_LENGTH=True,
    PAD_TO_MULTIPLE=64,
    SAVE_EVERY=0,
    EPOCHS=1,
    MAX_STEPS=0,
)
call = json.loads((HERE / "call4" / "predicted.json").read_text())
measured = {**call["measured"], "micro_batch_s": {int(k): v for k, v in call["measured"]["micro_batch_s"].items()}}
config = HERE.parent.parent / "configs" / "gemma-4-12b.json"
shapes, cfg = memory_budget.param_shapes_from_path(config), memory_budget.load_config(config)
print(
    "| GPUs | steps | predicted step s | measured step s (2..N) | error | predicted epoch s | measured epoch s "
    "(steps 2..N scaled to N, + save) | error | measured step 1 s |"
)
print("|---|---|---|---|---|---|---|---|---|")
for gpus, save_s in ((1, 1.96), (2, 2.12)):  # the "checkpoint step N saved in" lines of call4's logs
    layout = memory_budget.Layout(2, 0, False, 1024)
    allreduce = memory_budget.estimate(shapes, cfg, layout, seq_len=2048, world_size=gpus)["allreduce_seconds"]
    p = time_budget.predict(measured, tokens, group_keys, settings, gpus, 1, allreduce if gpus > 1 else 0)
    runs = [json.loads(line) for line in (HERE / "call4" / f"metrics_{gpus}gpu.jsonl").read_text().splitlines()]
    steps = [r["step_time_s"] for r in runs if "step_time_s" in r]
    steady = sum(steps[1:]) / len(steps[1:])
    epoch = steady * len(steps) + save_s
    print(
        f"| {gpus} | {p['steps_per_epoch']} (ran {len(steps)}) | {p['step_s']:.3f} | {steady:.3f} | "
        f"{100 * (p['step_s'] - steady) / steady:+.1f}% | {p['epoch_s']:.1f} | {epoch:.1f} | "
        f"{100 * (p['epoch_s'] - epoch) / epoch:+.1f}% | {steps[0]:.1f} |"
    )
