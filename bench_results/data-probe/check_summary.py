"""Check 3: chat_data.data_summary's line (its sample of up to 1,000 rows) against the truth over every row: rows
longer than MAX_LEN, target tokens cut, rows with no target left, scaled from the sample to the file.

python bench_results/data-probe/check_summary.py DATA.jsonl [MAX_LEN]
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

from chat_data import ChatDataset, control_tokens, data_summary, load_conversations, tokenize_conversation  # noqa: E402
from collate import IGNORE_INDEX  # noqa: E402


def counts(tok, rows, max_len):
    cut = targets = kept = no_target = 0
    for messages in rows:
        labels = tokenize_conversation(tok, messages, 1 << 30, True)["labels"]
        row_kept = sum(label != IGNORE_INDEX for label in labels[1:max_len])
        cut += len(labels) > max_len
        targets += sum(label != IGNORE_INDEX for label in labels[1:])
        kept += row_kept
        no_target += row_kept == 0
    return cut, targets - kept, targets, no_target


def main() -> None:
    path, max_len = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "tiny-gemma4")
    rows = load_conversations(path, control_tokens(tok))
    dataset = ChatDataset(rows, tok, max_len, True)
    t0 = time.time()
    print(data_summary(dataset, dataset, len(rows), path))
    print(f"(summary took {time.time() - t0:.1f} s)")
    sample = rows[:: max(1, len(rows) // 1000)]
    t0 = time.time()
    truth = counts(tok, rows, max_len)
    print(f"(truth over all {len(rows)} rows took {time.time() - t0:.1f} s)")
    est = counts(tok, sample, max_len)
    scale = len(rows) / len(sample)
    names = ["rows longer than MAX_LEN", "target tokens cut", "target tokens", "rows with no target left"]
    print(f"{'':28} {'sample':>8} {'x' + format(scale, '.1f'):>10} {'truth':>10} {'off by':>8}")
    for name, s, t in zip(names, est, truth, strict=True):
        print(f"{name:28} {s:8d} {s * scale:10.0f} {t:10d} {(s * scale - t) / t if t else float('nan'):8.1%}")
    print(f"fraction of target tokens cut: sample {est[1] / est[2]:.2%}, truth {truth[1] / truth[2]:.2%}")


if __name__ == "__main__":
    main()
