"""Check 2: on the mix, a packed step's loss and gradients equal the unpacked step's (tests/test_packing.py's check,
on rows of the mix: truncated ones at MAX_LEN, ones past the sliding window, weight-0 answers, text parts).

python bench_results/data-probe/check_packing.py DATA.jsonl [N_ROWS] [MAX_LEN]
"""

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402
from conftest import cpu_config, nonzero_lora_b  # noqa: E402
from test_packing import loss_and_grads  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import packing  # noqa: E402
import train_ddp as T  # noqa: E402
from chat_data import ChatDataset, control_tokens, load_conversations  # noqa: E402
from collate import IGNORE_INDEX, PadCollate  # noqa: E402


def main() -> None:
    path = sys.argv[1]
    n, max_len = (int(sys.argv[2]) if len(sys.argv) > 2 else 12), (int(sys.argv[3]) if len(sys.argv) > 3 else 2048)
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "tiny-gemma4")
    rows = load_conversations(path, control_tokens(tok))
    chosen = random.Random(1).sample(range(len(rows)), n)
    dataset = ChatDataset([rows[i] for i in chosen], tok, max_len, True)
    lengths = dataset.token_lengths
    packed_rows = packing.pack(lengths, list(range(n)), max_len)
    print(f"{n} rows, token lengths {lengths} (MAX_LEN={max_len}), packed into {len(packed_rows)}: {packed_rows}")
    cfg = cpu_config(LORA_DROPOUT=0.0, CE_CHUNK_TOKENS=0, GRADIENT_CHECKPOINTING=0)
    torch.manual_seed(0)
    model = nonzero_lora_b(T.add_lora(T.load_model(cfg, torch.device("cpu")), cfg))
    print("sliding window", model.get_base_model().config.get_text_config().sliding_window)
    examples = [dataset[i] for i in range(n)]
    order = [i for row in packed_rows for i in row]
    unpacked = PadCollate(tok.pad_token_id)([examples[i] for i in order])
    packed = packing.PackCollate(tok.pad_token_id, max_len)([[examples[i] for i in row] for row in packed_rows])
    (loss_u, n_u, grads_u), (loss_p, n_p, grads_p) = loss_and_grads(model, unpacked), loss_and_grads(model, packed)
    print(f"targets: unpacked {n_u}, packed {n_p}, labels {int((unpacked['labels'][:, 1:] != IGNORE_INDEX).sum())}")
    rel = abs(float(loss_p - loss_u)) / float(loss_u)
    print(f"loss: unpacked {float(loss_u):.8f}, packed {float(loss_p):.8f}, rel diff {rel:.2e}")
    worst = max(float((gp - gu).norm()) / max(float(gu.norm()), 1e-30) for gp, gu in zip(grads_p, grads_u, strict=True))
    print(f"gradients: worst relative norm difference over {len(grads_u)} tensors {worst:.2e} (test's bound 1e-4)")
    ok = n_p == n_u and abs(float(loss_p - loss_u)) <= 1e-5 * float(loss_u) and worst <= 1e-4
    print("EQUAL" if ok else "DIFFERENT")


if __name__ == "__main__":
    main()
