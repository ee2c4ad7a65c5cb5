"""packing.py: rows that never split a conversation, the same on every rank; a packed step computes exactly what
the unpacked step does, and no conversation sees another (both layer types: one conversation is longer than the
tiny model's sliding window)."""

import random

import pytest
import torch
from conftest import BACKENDS, RANKS, ROOT, SAMPLE_DATA, cpu_config, nonzero_lora_b, torchrun

import attention
import packing
import train_ddp as T
from chat_data import ChatDataset, load_conversations
from collate import IGNORE_INDEX, PadCollate
from lm_loss import CausalLMLoss


def test_rows_hold_every_conversation_once_within_max_len_and_are_the_same_for_the_same_seed():
    rng = random.Random(0)
    lengths = [min(2048, int(rng.lognormvariate(6.0, 0.8))) for _ in range(2000)]
    rows = packing.rows_of_epoch(lengths, seed=1234, epoch=0, max_len=2048)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 2048 for row in rows)
    assert sum(lengths) / (len(rows) * 2048) > 0.95  # first fit over 32 open rows: near-full rows
    assert rows == packing.rows_of_epoch(lengths, seed=1234, epoch=0, max_len=2048)
    assert rows != packing.rows_of_epoch(lengths, seed=1234, epoch=1, max_len=2048)


def test_every_rank_gets_the_same_number_of_packed_steps(tokenizer):
    cfg = cpu_config(PACKING=True, MAX_LEN=512, MICRO_BATCH=2, ACCUM_STEPS=2, NUM_WORKERS=0)
    dataset = ChatDataset(load_conversations(str(SAMPLE_DATA)), tokenizer, cfg.MAX_LEN, True)
    for epoch in (0, 1):
        rows = T.epoch_data(dataset, cfg, epoch)
        steps = {len(T.train_loader(rows, cfg, rank, 3, epoch, 0, None)) // 2 for rank in range(3)}
        assert steps == {T.steps_per_epoch(len(rows), 3, cfg)}


@pytest.fixture(scope="module")
def model_and_rows(tokenizer):
    cfg = cpu_config(LORA_DROPOUT=0.0, CE_CHUNK_TOKENS=0, GRADIENT_CHECKPOINTING=0)
    torch.manual_seed(0)
    model = nonzero_lora_b(T.add_lora(T.load_model(cfg, torch.device("cpu")), cfg))
    dataset = ChatDataset(load_conversations(str(SAMPLE_DATA)), tokenizer, 2048, True)
    by_length = sorted(range(len(dataset)), key=lambda i: dataset.token_lengths[i])
    chosen = [by_length[-1], by_length[0], by_length[len(by_length) // 2], by_length[-2]]  # 337 and 278 > 128
    assert dataset.token_lengths[chosen[0]] > model.get_base_model().config.get_text_config().sliding_window
    return model, [dataset[i] for i in chosen]


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss, n = CausalLMLoss(model, 0)(**T.on_device(batch, torch.device("cpu")))
    loss.backward()
    return loss.detach(), int(n), [p.grad.clone() for _, p in sorted(model.named_parameters()) if p.requires_grad]


def test_a_packed_step_gives_the_unpacked_loss_and_gradients(tokenizer, model_and_rows):
    model, examples = model_and_rows
    unpacked = PadCollate(tokenizer.pad_token_id)(examples)
    packed = packing.PackCollate(tokenizer.pad_token_id, 704)([examples[:2], examples[2:]])  # 2 rows of 2
    (loss_u, n_u, grads_u), (loss_p, n_p, grads_p) = loss_and_grads(model, unpacked), loss_and_grads(model, packed)
    assert n_p == n_u == int((unpacked["labels"][:, 1:] != IGNORE_INDEX).sum())
    torch.testing.assert_close(loss_p, loss_u, rtol=1e-5, atol=0)
    for gp, gu in zip(grads_p, grads_u, strict=True):
        assert float((gp - gu).norm()) <= 1e-4 * float(gu.norm())


def test_no_conversation_sees_another_in_its_row(tokenizer, model_and_rows):
    model, examples = model_and_rows
    collate = packing.PackCollate(tokenizer.pad_token_id, 1024)
    changed = [dict(examples[0]), *examples[1:]]
    changed[0]["input_ids"] = [changed[0]["input_ids"][0]] + [7] * (len(changed[0]["input_ids"]) - 1)
    window = model.get_base_model().config.get_text_config().sliding_window
    with torch.no_grad():
        logits = []
        for row in (examples, changed):
            batch = collate([row])
            masks = attention.packed_masks(batch["position_ids"], window)  # what lm_loss gives the decoder
            logits.append(
                model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=masks).logits[0]
            )
    first = len(examples[0]["input_ids"])  # everything after the changed first conversation must stay the same
    torch.testing.assert_close(logits[1][first:], logits[0][first:], rtol=0, atol=1e-5)
    assert not torch.allclose(logits[1][:first], logits[0][:first])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_packed_run_killed_mid_epoch_resumes_bitwise(tmp_path, backend):
    """Packed rows are skipped exactly on resume: a job SIGKILLed after its step-3 checkpoint, mid-epoch, and
    started again ends with the adapter of the uninterrupted run (on NCCL: flex_attention's block masks)."""
    from test_recovery import RUN, Job, adapter, assert_bitwise_equal, metrics, resumed_step

    data = tmp_path / "train.jsonl"
    rows = SAMPLE_DATA.read_text().splitlines()
    data.write_text("\n".join(rows[i % len(rows)] for i in range(20 * RANKS)) + "\n")  # 40 on 2 ranks
    env = {**RUN, "DATA_PATH": str(data), "PACKING": "1", "MAX_LEN": "256", "MICRO_BATCH": "1", "SAVE_EVERY": "1"}
    env.pop("EVAL_EVERY")
    reference = torchrun(ROOT / "train_ddp.py", env={**env, "OUTPUT_DIR": str(tmp_path / "reference")}, backend=backend)
    assert reference.returncode == 0, reference.output[-4000:]
    epoch_of = {r["step"]: r["epoch"] for r in metrics(tmp_path / "reference") if "epoch" in r}
    assert epoch_of[3] == epoch_of[4], epoch_of  # mid-epoch: the resumed epoch skips rows already trained
    job = Job.single_node({**env, "OUTPUT_DIR": str(tmp_path / "out")}, backend=backend)
    job.wait_for("checkpoint step 3 saved")
    job.kill()
    run = torchrun(ROOT / "train_ddp.py", env={**env, "OUTPUT_DIR": str(tmp_path / "out")}, backend=backend)
    assert run.returncode == 0, run.output[-4000:]
    assert resumed_step(run.output) >= 3
    counting = f"packing: counting the token lengths of {20 * RANKS} rows, once (kept in "
    assert counting in reference.output and counting not in run.output, run.output[-4000:]  # the resume reuses them
    assert_bitwise_equal(adapter(tmp_path / "out"), adapter(tmp_path / "reference"))
