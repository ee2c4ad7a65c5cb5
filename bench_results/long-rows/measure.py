"""Time and peak RSS of fetching one row with a 10 MB answer (tokenize_conversation, MAX_LEN=2048).

Usage, from the repository root: python bench_results/long-rows/measure.py PATH/TO/chat_data.py
"""

import importlib.util
import resource
import sys
import time

sys.path.insert(0, ".")
from transformers import AutoTokenizer  # noqa: E402

spec = importlib.util.spec_from_file_location("chat_data_under_test", sys.argv[1])
chat_data = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chat_data)
tokenizer = AutoTokenizer.from_pretrained("assets/tiny-gemma4")
answer = "line of a log, 42 ms\n" * 500_000
row = [{"role": "user", "content": "Summarise this log."}, {"role": "assistant", "content": answer}]
start = time.perf_counter()
example = chat_data.tokenize_conversation(tokenizer, row, 2048, True)
seconds = time.perf_counter() - start
peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(
    f"{sys.argv[1]}: {len(answer) / 1e6:.1f} MB answer -> {len(example['input_ids'])} tokens in {seconds:.2f} s, "
    f"peak RSS {peak_gb:.2f} GB"
)
