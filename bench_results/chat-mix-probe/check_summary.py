"""The job's data line (chat_data.data_summary, from 1,000 rows spread over the file) beside the same line from
every row (sample_size = the row count).

    python bench_results/chat-mix-probe/check_summary.py MIX.jsonl [MAX_LEN]
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import chat_data  # noqa: E402

path, max_len = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2048
tok = chat_data.chat_tokenizer(str(Path(__file__).resolve().parents[2] / "assets" / "tiny-gemma4"))
dataset = chat_data.ChatDataset(chat_data.load_conversations(path, chat_data.control_tokens(tok)), tok, max_len, True)
for size in (1000, len(dataset)):
    t0 = time.perf_counter()
    line = chat_data.data_summary(dataset, dataset, len(dataset), path, sample_size=size)
    print(f"{line} ({time.perf_counter() - t0:.1f} s)")
