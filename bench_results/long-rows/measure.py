"""Fetch time of long rows with a given chat_data.py (CPU, this repo's tiny tokenizer, MAX_LEN=2048): a row with a
10 MB answer (time and peak RSS of tokenize_conversation), chats of 10, 100 and 300 turns of about 40 words a
message (a fetch, and the packed length count), and a chat of 1000 terse turns at MAX_LEN=8192.

Usage, from the repository root: python bench_results/long-rows/measure.py PATH/TO/chat_data.py [TEMPLATE]
(TEMPLATE: a chat template file to render with instead of the tiny model's, e.g. Gemma 4's published one)
"""

import importlib.util
import random
import resource
import sys
import time

sys.path.insert(0, ".")
from transformers import AutoTokenizer  # noqa: E402

spec = importlib.util.spec_from_file_location("chat_data_under_test", sys.argv[1])
chat_data = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chat_data)
tokenizer = AutoTokenizer.from_pretrained("assets/tiny-gemma4")
if len(sys.argv) > 2:
    tokenizer.chat_template = open(sys.argv[2]).read()

rng = random.Random(0)
for turns in (10, 100, 300):
    chat = [
        {"role": role, "content": " ".join(rng.choice(["tea", "of", "the", "42", "Grüße"]) for _ in range(40))}
        for _ in range(turns)
        for role in ("user", "assistant")
    ]
    start = time.perf_counter()
    for _ in range(5):
        example = chat_data.tokenize_conversation(tokenizer, chat, 2048, True)
    fetch_ms = (time.perf_counter() - start) / 5 * 1000
    start = time.perf_counter()
    lengths = chat_data.ChatDataset([chat] * 5, tokenizer, 2048, True).token_lengths
    count_ms = (time.perf_counter() - start) / 5 * 1000
    print(
        f"{sys.argv[1]}: {turns} turns -> {len(example['input_ids'])} tokens: fetch {fetch_ms:.1f} ms, "
        f"length count {count_ms:.1f} ms a row ({lengths[0]})"
    )

terse = [
    {"role": role, "content": "ok" if role == "user" else "k"} for _ in range(1000) for role in ("user", "assistant")
]
start = time.perf_counter()
example = chat_data.tokenize_conversation(tokenizer, terse, 8192, True)
fetch_ms = (time.perf_counter() - start) * 1000
start = time.perf_counter()
lengths = chat_data.ChatDataset([terse] * 2, tokenizer, 8192, True).token_lengths
print(
    f"{sys.argv[1]}: 1000 terse turns (an agent's 'ok'/'k'), MAX_LEN=8192 -> {len(example['input_ids'])} tokens: "
    f"fetch {fetch_ms:.1f} ms, length count {(time.perf_counter() - start) / 2 * 1000:.1f} ms a row ({lengths[0]})"
)

answer = "line of a log, 42 ms\n" * 500_000  # last: its peak RSS is the process's
row = [{"role": "user", "content": "Summarise this log."}, {"role": "assistant", "content": answer}]
start = time.perf_counter()
example = chat_data.tokenize_conversation(tokenizer, row, 2048, True)
seconds = time.perf_counter() - start
peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(
    f"{sys.argv[1]}: {len(answer) / 1e6:.1f} MB answer -> {len(example['input_ids'])} tokens in {seconds:.2f} s, "
    f"peak RSS {peak_gb:.2f} GB"
)
