"""Check 4, the packed start: one process counting ChatDataset.token_lengths over a file (what each rank does
before step 1 with PACKING=1, when OUTPUT_DIR keeps no lengths yet).

python bench_results/data-probe/time_lengths.py DATA.jsonl [MAX_LEN]
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

from chat_data import ChatDataset, load_conversations  # noqa: E402


def main() -> None:
    path, max_len = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "tiny-gemma4")
    rows = load_conversations(path)
    t0 = time.time()
    lengths = ChatDataset(rows, tok, max_len, True).token_lengths
    took = time.time() - t0
    print(f"{len(rows)} rows, {sum(lengths)} tokens (each at most {max_len}): token_lengths took {took:.1f} s")


if __name__ == "__main__":
    main()
