"""Packed rows of a chat mix give the unpacked loss and gradients (tiny model, CPU, dropout off): the first
packed micro-batches of epoch 0, as train_ddp.py's PACKING=1 builds them, against the same conversations padded.

    python bench_results/chat-mix-probe/check_packing.py MIX.jsonl [MAX_LEN] [MICRO_BATCHES]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import train_ddp as T  # noqa: E402
from chat_data import ChatDataset, chat_tokenizer, control_tokens, load_conversations  # noqa: E402
from collate import PadCollate  # noqa: E402
from lm_loss import CausalLMLoss  # noqa: E402
from packing import PackCollate  # noqa: E402

path, max_len = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 512
batches = int(sys.argv[3]) if len(sys.argv) > 3 else 4
cfg = T.Config(ATTENTION_KERNEL="sdpa", MAX_LEN=max_len, PACKING=True, LORA_DROPOUT=0.0, GRADIENT_CHECKPOINTING=0)
tok = chat_tokenizer(cfg.MODEL_ID)
dataset = ChatDataset(load_conversations(path, control_tokens(tok)), tok, max_len, True)
rows = T.epoch_data(dataset, cfg, 0)  # PackedRows
torch.manual_seed(0)
model = T.add_lora(T.load_model(cfg, torch.device("cpu")), cfg)
with torch.no_grad():
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.normal_(0, 0.02)  # B = 0 at init would make every adapter gradient but B's zero
loss_fn = CausalLMLoss(model, 0)


def loss_and_grads(batch):
    model.zero_grad(set_to_none=True)
    loss, n = loss_fn(**T.on_device(batch, torch.device("cpu")))
    loss.backward()
    return float(loss), int(n), [p.grad.clone() for p in model.parameters() if p.requires_grad]


print(
    "| micro-batch | conversations | target tokens | loss sum packed | loss sum unpacked | rel. diff | grad rel. diff |"
)
print("|---|---|---|---|---|---|---|")
for b in range(batches):
    packed_rows = [rows.rows[r] for r in range(2 * b, 2 * b + 2)]
    examples = [[dataset[i] for i in row] for row in packed_rows]  # each row's conversations
    lp, np_, gp = loss_and_grads(PackCollate(tok.pad_token_id, max_len)(examples))
    lu, nu, gu = loss_and_grads(PadCollate(tok.pad_token_id)([e for row in examples for e in row]))
    grad = max(float((a - b_).norm()) / max(float(b_.norm()), 1e-30) for a, b_ in zip(gp, gu, strict=True))
    diff = abs(lp - lu) / max(abs(lu), 1e-30)
    print(f"| {b} | {sum(map(len, examples))} | {np_} / {nu} | {lp:.6f} | {lu:.6f} | {diff:.2e} | {grad:.2e} |")
