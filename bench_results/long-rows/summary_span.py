"""data_summary's time per sampled row for a chat of 300 turns (MAX_LEN=2048, the tiny tokenizer), at SUMMARY_SPAN
16, 4 and 2.

Usage, from the repository root: .venv/bin/python bench_results/long-rows/summary_span.py
"""

import random
import sys
import time

sys.path.insert(0, ".")
from transformers import AutoTokenizer  # noqa: E402

import chat_data  # noqa: E402

tokenizer = AutoTokenizer.from_pretrained("assets/tiny-gemma4")
rng = random.Random(0)
chat = [
    {"role": role, "content": " ".join(rng.choice(["tea", "of", "the", "42", "Grüße"]) for _ in range(40))}
    for _ in range(300)
    for role in ("user", "assistant")
]
dataset = chat_data.ChatDataset([chat] * 5, tokenizer, 2048, True)
for span in (16, 4, 2):
    chat_data.SUMMARY_SPAN = span
    start = time.perf_counter()
    summary = chat_data.data_summary(dataset, dataset, 5, "chat.jsonl")
    print(f"SUMMARY_SPAN={span}: {(time.perf_counter() - start) / 5 * 1000:.0f} ms a sampled row | {summary}")
