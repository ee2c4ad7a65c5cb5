"""Check 5, padding: GROUP_BY_LENGTH sorts each optimizer step's samples by characters (ChatDataset.lengths), not
tokens. On a mix of scripts (a CJK character is about a token, a Latin word about 4-6 characters a token) that
groups rows of unlike token lengths: the padding of micro-batches sorted by characters vs by tokens vs unsorted.

python bench_results/data-probe/check_grouping.py DATA.jsonl [MICRO_BATCH] [ACCUM_STEPS]
"""

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

from chat_data import ChatDataset, load_conversations  # noqa: E402


def padding(tokens: list[int], key: list[int] | None, micro: int, window: int, seed: int = 0) -> float:
    order = list(range(len(tokens)))
    random.Random(seed).shuffle(order)
    real = padded = 0
    for at in range(0, len(order) - window + 1, window):
        step = order[at : at + window]
        if key is not None:
            step.sort(key=lambda i: -key[i])
        for m in range(0, window, micro):
            batch = [tokens[i] for i in step[m : m + micro]]
            real, padded = real + sum(batch), padded + max(batch) * len(batch)
    return 1 - real / padded


def main() -> None:
    path = sys.argv[1]
    micro, accum = (int(sys.argv[2]) if len(sys.argv) > 2 else 4), (int(sys.argv[3]) if len(sys.argv) > 3 else 4)
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "tiny-gemma4")
    dataset = ChatDataset(load_conversations(path), tok, 2048, True)
    tokens, chars = dataset.token_lengths, dataset.lengths
    ratio = sorted(c / t for c, t in zip(chars, tokens, strict=True))
    print(
        f"{len(tokens)} rows; characters per token: p10 {ratio[len(ratio) // 10]:.2f}, median "
        f"{ratio[len(ratio) // 2]:.2f}, p90 {ratio[len(ratio) * 9 // 10]:.2f}"
    )
    window = micro * accum
    for name, key in (("unsorted", None), ("by characters (GROUP_BY_LENGTH)", chars), ("by tokens", tokens)):
        print(f"MICRO_BATCH={micro} ACCUM_STEPS={accum}, {name}: padding {padding(tokens, key, micro, window):.1%}")


if __name__ == "__main__":
    main()
