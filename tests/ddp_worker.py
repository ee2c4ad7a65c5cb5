"""Multi-rank scenarios for tests/test_train_ddp.py, run under torchrun (gloo, CPU).

    torchrun --nproc_per_node=2 tests/ddp_worker.py SCENARIO OUTPUT_DIR

Each scenario uses train_ddp.py's own functions (not copies) and writes rank 0's findings to
OUTPUT_DIR/result.json (dropout_masks: train_ddp.main itself, each rank's to masks_rank{RANK}.json); any failed
check raises, so the job exits non-zero.
"""

import dataclasses
import hashlib
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

import chat_data  # noqa: E402
import settings  # noqa: E402
import train_ddp as T  # noqa: E402
from collate import PadCollate  # noqa: E402
from lm_loss import CausalLMLoss  # noqa: E402

ACCUM = 2
GRAD_CLIP = 1e-3  # far under the tiny model's gradient norm: optimizer_step clips
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

    reduced = {"calls": 0, "elements": 0, "storages": set()}

    def counting_hook(state, bucket):
        reduced["calls"] += 1
        reduced["elements"] += bucket.buffer().numel()
        reduced["storages"].add(bucket.buffer().untyped_storage().data_ptr())
        return allreduce_hook(state, bucket)

    model = T.wrap_ddp(CausalLMLoss(peft_model, CFG.CE_CHUNK_TOKENS), torch.device("cpu"))  # the job's own DDP
    model.register_comm_hook(None, counting_hook)
    T.forward_backward(model, mine[:1], torch.device("cpu"))  # warm-up step: DDP rebuilds buckets after it
    model.zero_grad(set_to_none=True)
    reduced.update(calls=0, elements=0, storages=set())
    loss_sum, (n_targets, *_), _ = T.forward_backward(model, mine, torch.device("cpu"))
    trainable = {n: p for n, p in peft_model.named_parameters() if p.requires_grad}
    params = list(trainable.values())
    n_trainable = sum(p.numel() for p in params)
    ddp_grads = {n: p.grad.clone() for n, p in trainable.items()}
    # gradient_as_bucket_view: each gradient lives in the buffer its bucket all-reduced (no second copy of them)
    grads_are_bucket_views = all(p.grad.untyped_storage().data_ptr() in reduced["storages"] for p in params)

    # The job's optimizer step, clipping to a GRAD_CLIP far under the norm; what AdamW then steps with is kept.
    cfg = dataclasses.replace(CFG, GRAD_CLIP=GRAD_CLIP)
    optimizer = torch.optim.AdamW(params, lr=cfg.LR)
    stepped_with = []
    optimizer.register_step_pre_hook(lambda *_: stepped_with.append({n: p.grad.clone() for n, p in trainable.items()}))
    scheduler = T.lr_schedule(optimizer, cfg, total_steps=10, steps_taken=0)
    grad_norm, skipped, _ = T.optimizer_step(optimizer, scheduler, params, cfg, loss_sum, n_targets, step=1)
    assert skipped is None and len(stepped_with) == 1, skipped
    clipped_norm = float(torch.nn.utils.get_total_norm(list(stepped_with[0].values())))

    # Reference: one process, no DDP, the whole global batch at once, global token-mean loss.
    _, reference_model = build()
    loss, n = CausalLMLoss(reference_model, CFG.CE_CHUNK_TOKENS)(**everything)
    (loss / n).backward()
    reference = {name: p.grad for name, p in reference_model.named_parameters() if p.requires_grad}
    reference_norm = float(torch.nn.utils.get_total_norm(list(reference.values())))
    # Clipped after the all-reduce: the norm optimizer_step measured (and clipped) is the global gradient's, and
    # AdamW steps with that gradient scaled to GRAD_CLIP (each rank's own gradient clipped first would differ).
    assert abs(grad_norm - reference_norm) < 1e-4 * reference_norm, (
        f"optimizer_step measured a norm of {grad_norm}, the global gradient's is {reference_norm}"
    )
    for name, g in stepped_with[0].items():
        expected = reference[name] * (GRAD_CLIP / reference_norm)
        torch.testing.assert_close(
            g,
            expected,
            rtol=1e-4,
            atol=1e-5 * float(expected.abs().max()),
            msg=lambda m, name=name: (
                f"{name}, as AdamW stepped with it (the global gradient clipped to GRAD_CLIP): {m}"
            ),
        )
    worst = 0.0  # largest error relative to the tensor's largest gradient: fp32 summation-order noise only
    for name, grad in reference.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(
            ddp_grads[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=lambda m, name=name: f"{name}: {m}"
        )
        worst = max(worst, float((ddp_grads[name] - grad).abs().max()) / scale)
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
                    "grad_norm": grad_norm,
                    "reference_grad_norm": reference_norm,
                    "clipped_norm": clipped_norm,
                    "grad_clip": GRAD_CLIP,
                    "grads_are_bucket_views": grads_are_bucket_views,
                    "buffers_synced_in_forward": model.will_sync_module_buffers(),
                }
            )
        )


def save_and_reload(out: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    rank = dist.get_rank()
    tokenizer, peft_model = build()
    model = T.wrap_ddp(CausalLMLoss(peft_model, CFG.CE_CHUNK_TOKENS), torch.device("cpu"))
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


def dropout_masks(out: Path):
    """train_ddp.main itself (its settings from the environment), recording on each rank which elements every
    LoRA dropout zeroed in each optimizer step's forward_backward: OUTPUT_DIR/masks_rank{RANK}.json, a list by
    step of mask hashes in call order."""
    steps, recording, add_lora, forward_backward = [], [False], T.add_lora, T.forward_backward

    def record(module, inputs, output):
        if recording[0]:  # in a step's forward_backward (not settle_buckets' throwaway pass)
            steps[-1].append(hashlib.sha256((output == 0).numpy().tobytes()).hexdigest())

    def add_lora_recording(model, cfg):
        peft_model = add_lora(model, cfg)
        for name, module in peft_model.named_modules():
            if isinstance(module, torch.nn.Dropout) and ".lora_dropout." in name:
                module.register_forward_hook(record)
        return peft_model

    def forward_backward_recording(*args, **kwargs):
        steps.append([])
        recording[0] = True
        try:
            return forward_backward(*args, **kwargs)
        finally:
            recording[0] = False

    T.add_lora, T.forward_backward = add_lora_recording, forward_backward_recording
    del sys.argv[1:]  # train_ddp takes no arguments
    T.main()
    (out / f"masks_rank{os.environ['RANK']}.json").write_text(json.dumps(steps))


if __name__ == "__main__":
    scenario, out = sys.argv[1], Path(sys.argv[2])
    if scenario == "dropout_masks":  # train_ddp.main forms its own process group
        dropout_masks(out)
        sys.exit()
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    try:
        {"grad_equivalence": grad_equivalence, "save_and_reload": save_and_reload}[scenario](out)
    finally:
        dist.destroy_process_group()
