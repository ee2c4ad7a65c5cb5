"""Multi-rank scenarios for tests/test_train_ddp.py, run under torchrun (gloo, CPU).

    torchrun --nproc_per_node=2 tests/ddp_worker.py SCENARIO OUTPUT_DIR

Each scenario uses train_ddp.py's own functions (not copies) and writes rank 0's findings to
OUTPUT_DIR/result.json; any failed check raises, so the job exits non-zero.
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LORA_DROPOUT", "0.0")  # deterministic forward for exact comparisons
os.environ["OUTPUT_DIR"] = sys.argv[2]  # never the default out/: a user's run lives there
os.environ.setdefault("CE_CHUNK_TOKENS", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from conftest import nonzero_lora_b  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import chat_data  # noqa: E402
import settings  # noqa: E402
import train_ddp as T  # noqa: E402
from collate import PadCollate  # noqa: E402
from lm_loss import CausalLMLoss  # noqa: E402

ACCUM = 2
CFG = T.plan(*settings.read(T.Config, T.ALLOWED), 1, torch.device("cpu"))[0]


def build(seed: int = 0):
    """The tiny Gemma 4 with adapters whose B matrices are non-zero (so every LoRA weight gets a gradient)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(CFG.MODEL_ID)
    torch.manual_seed(seed)
    return tokenizer, nonzero_lora_b(T.add_lora(T.load_model(CFG, torch.device("cpu")), CFG))


def micro_batches_for(tokenizer, conversations, rank, world):
    """Rank r gets micro-batches r, r+world, ...: 2 samples each, of unequal lengths."""
    collate = PadCollate(tokenizer.pad_token_id)
    examples = [chat_data.tokenize_conversation(tokenizer, c, CFG.MAX_LEN, True) for c in conversations]
    chunks = [examples[i : i + 2] for i in range(0, len(examples), 2)]
    return [collate(c) for c in chunks[rank::world]], collate(examples)


def grad_equivalence(out: Path):
    rank, world = dist.get_rank(), dist.get_world_size()
    tokenizer, peft_model = build()
    conversations = chat_data.load_conversations(CFG.DATA_PATH)[: 2 * ACCUM * world]
    mine, everything = micro_batches_for(tokenizer, conversations, rank, world)

    reduced = {"calls": 0, "elements": 0}

    def counting_hook(state, bucket):
        reduced["calls"] += 1
        reduced["elements"] += bucket.buffer().numel()
        return allreduce_hook(state, bucket)

    model = DDP(CausalLMLoss(peft_model, CFG.CE_CHUNK_TOKENS), gradient_as_bucket_view=True)
    model.register_comm_hook(None, counting_hook)
    T.forward_backward(model, mine[:1], torch.device("cpu"))  # warm-up step: DDP rebuilds buckets after it
    model.zero_grad(set_to_none=True)
    reduced.update(calls=0, elements=0)
    loss_sum, (n_targets, *_), _ = T.forward_backward(model, mine, torch.device("cpu"))
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    ddp_grads = {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.requires_grad}

    # Reference: one process, no DDP, the whole global batch at once, global token-mean loss.
    _, reference_model = build()
    loss, n = CausalLMLoss(reference_model, CFG.CE_CHUNK_TOKENS)(**everything)
    (loss / n).backward()
    worst = 0.0  # largest error relative to the tensor's largest gradient: fp32 summation-order noise only
    for name, p in reference_model.named_parameters():
        if p.requires_grad:
            scale = float(p.grad.abs().max())
            torch.testing.assert_close(
                ddp_grads[name], p.grad, rtol=1e-4, atol=1e-5 * scale, msg=lambda m, name=name: f"{name}: {m}"
            )
            worst = max(worst, float((ddp_grads[name] - p.grad).abs().max()) / scale)
    assert abs(loss_sum - float(loss)) < 1e-3 * abs(float(loss)), (loss_sum, float(loss))
    if rank == 0:
        (out / "result.json").write_text(
            json.dumps(
                {
                    "allreduce_calls": reduced["calls"],
                    "allreduced_elements": reduced["elements"],
                    "trainable_elements": n_trainable,
                    "max_rel_grad_diff": worst,
                    "n_targets": n_targets,
                    "lengths": [int(m) for m in everything["attention_mask"].sum(1)],
                }
            )
        )


def save_and_reload(out: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    rank = dist.get_rank()
    tokenizer, peft_model = build()
    model = DDP(CausalLMLoss(peft_model, CFG.CE_CHUNK_TOKENS), gradient_as_bucket_view=True)
    writers = []
    original_save = peft_model.save_pretrained
    peft_model.save_pretrained = lambda *a, **k: (writers.append(rank), original_save(*a, **k))[1]
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    mine, _ = micro_batches_for(tokenizer, chat_data.load_conversations(CFG.DATA_PATH)[:8], rank, dist.get_world_size())
    for _ in range(2):
        T.forward_backward(model, mine, torch.device("cpu"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    path = T.save_adapter(model, {}, {"step": 2}, CFG.OUTPUT_DIR)
    all_writers = [None] * dist.get_world_size()
    dist.all_gather_object(all_writers, writers)
    if rank == 0:
        ids = mine[0]["input_ids"]
        peft_model.eval()
        with torch.no_grad():
            trained = peft_model(input_ids=ids).logits
            reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(CFG.MODEL_ID), path).eval()
            again = reloaded(input_ids=ids).logits
        torch.testing.assert_close(again, trained, rtol=0, atol=1e-5)
        (out / "result.json").write_text(
            json.dumps({"writers": all_writers, "files": sorted(p.name for p in path.iterdir())})
        )


if __name__ == "__main__":
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    try:
        {"grad_equivalence": grad_equivalence, "save_and_reload": save_and_reload}[scenario](out)
    finally:
        dist.destroy_process_group()
