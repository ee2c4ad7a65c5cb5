"""CPU timings behind the session-11 data changes (tiny model's tokenizer, this machine's cores):
one 300-exchange conversation (600 messages, ~127k characters) tokenized with its labels, and the lengths pass
packing makes before step 1 (ChatDataset.token_lengths) against rendering and tokenizing each row whole.

    .venv/bin/python bench_results/fault-probes/row_time.py
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

import chat_data  # noqa: E402

tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "tiny-gemma4")
words = "the model answers each question with care because every token counts".split()
long_row = [
    {"role": role, "content": " ".join(words[(i + k) % len(words)] for k in range(35))}
    for i in range(300)
    for role in ("user", "assistant")
]
start = time.perf_counter()
chat_data.tokenize_conversation(tok, long_row, 2048, True)
print(f"600-message row ({sum(len(m['content']) for m in long_row):,} chars): {time.perf_counter() - start:.2f} s")

rows = chat_data.load_conversations(str(ROOT / "assets" / "sample_chat.jsonl")) * 105  # 10,080 rows
start = time.perf_counter()
lengths = chat_data.ChatDataset(rows, tok, 2048, True).token_lengths
per_100k = (time.perf_counter() - start) * 1e5 / len(rows)
start = time.perf_counter()
for at in range(0, len(rows), 1024):
    tok([tok.apply_chat_template(c, tokenize=False) for c in rows[at : at + 1024]], add_special_tokens=False)
whole = (time.perf_counter() - start) * 1e5 / len(rows)
print(f"lengths pass: {per_100k:.0f} s per 100k rows (each row rendered whole, no per-turn renders: {whole:.0f} s)")
