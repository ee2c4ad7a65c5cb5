"""train_ddp.py: in-process checks of its pieces, and real 2-rank gloo jobs (each bounded in time)."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import (
    BACKENDS,
    RANKS,
    ROOT,
    SAMPLE_DATA,
    TINY_MODEL,
    cpu_config,
    free_port,
    kill_tree,
    launch_env,
    nonzero_lora_b,
    torchrun,
)

import chat_data
import guards
import memory_budget
import settings
import train_ddp as T
from collate import IGNORE_INDEX, PadCollate
from guards import InputError
from lm_loss import CausalLMLoss

CPU = cpu_config()


@pytest.fixture(scope="module")
def tiny_lora_model():
    torch.manual_seed(0)
    return T.add_lora(T.load_model(CPU, torch.device("cpu")), CPU)


class Indices(list):
    """A dataset whose samples are their own indices, with the lengths length grouping sorts by."""

    def __init__(self, n: int, lengths: list[int] | None = None):
        super().__init__(range(n))
        self.lengths = lengths


def write_rows(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def sample_rows(n):
    """The first n rows of the sample data, repeated from its start past its 96."""
    rows = SAMPLE_DATA.read_text().splitlines()
    return [rows[i % len(rows)] for i in range(n)]


# ---------------------------------------------------------------- data
@pytest.mark.parametrize("n_samples", [13, 27, 37, 96])
@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_runs_the_same_number_of_steps(n_samples, world):
    cfg = cpu_config(MICRO_BATCH=2, ACCUM_STEPS=2, GROUP_BY_LENGTH=False)
    dataset = Indices(n_samples)
    if n_samples < world * 4:
        with pytest.raises(InputError, match="needs"):
            T.steps_per_epoch(n_samples, world, cfg)
        return
    steps = {len(T.train_loader(dataset, cfg, r, world, 0, 0, None)) // 2 for r in range(world)}
    assert steps == {T.steps_per_epoch(n_samples, world, cfg)}


def test_data_too_few_for_one_step_is_told_what_fits():
    """PACKING=1 on the embedded sample (7 rows of 2,048 tokens) stopped with what one step needs and no way on."""

    def refusal(n_samples, world, **settings):
        with pytest.raises(InputError) as e:
            T.steps_per_epoch(n_samples, world, cpu_config(**settings))
        return str(e.value).split(" = ")[-1]

    assert refusal(7, 2, PACKING=True) == (
        "16; it fits with ACCUM_STEPS=3, fewer ranks, a smaller MAX_LEN (more packed rows) or more data"
    )
    assert (
        refusal(7, 1, PACKING=True)
        == "8; it fits with ACCUM_STEPS=7, a smaller MAX_LEN (more packed rows) or more data"
    )
    assert (
        refusal(3, 2, MICRO_BATCH=2, ACCUM_STEPS=1)
        == "4; it fits with MICRO_BATCH=1 ACCUM_STEPS=1, fewer ranks or more data"
    )
    assert refusal(3, 4) == "32; it fits with fewer ranks or more data"


def test_every_epoch_deals_the_rows_in_a_new_order():
    """train_loader sets the sampler's epoch: without it every epoch would repeat epoch 0's order on every rank
    (the same micro-batches, the same optimizer steps), while each epoch still deals every row once."""
    cfg = cpu_config(MICRO_BATCH=2, ACCUM_STEPS=2, NUM_WORKERS=0, GROUP_BY_LENGTH=False)
    dataset, world = Indices(32), 2
    by_epoch = [
        [[i for b in T.train_loader(dataset, cfg, rank, world, epoch, 0, None) for i in b.tolist()] for rank in (0, 1)]
        for epoch in (0, 1)
    ]
    for shards in by_epoch:  # every row once per epoch, over the ranks
        assert sorted(shards[0] + shards[1]) == list(range(32))
    for rank in (0, 1):
        assert by_epoch[0][rank] != by_epoch[1][rank], f"rank {rank} sees epoch 0's order again in epoch 1"


class StuckAfterTwo(Indices):
    """A dataset whose loader worker is stuck from its third sample on (a row that never finishes)."""

    served = 0  # per worker process (forked)

    def __getitem__(self, i):
        StuckAfterTwo.served += 1
        if StuckAfterTwo.served > 2:
            time.sleep(600)
        return super().__getitem__(i)


def test_a_loader_worker_stuck_in_the_data_ends_the_rank_in_dist_timeout_s_with_its_stacks(tmp_path, capfd):
    """With every rank's worker stuck the same way no rank enters a collective, so no watchdog could tell: the
    job waited silently. The loader now raises after DIST_TIMEOUT_S, its workers print their stacks first, and the
    rank's report is one line."""
    cfg = cpu_config(MICRO_BATCH=2, ACCUM_STEPS=1, NUM_WORKERS=1, GROUP_BY_LENGTH=False, DIST_TIMEOUT_S=3)
    batches, outcome = iter(T.train_loader(StuckAfterTwo(16), cfg, 0, 1, 0, 0, None)), []
    assert len(next(batches)) == 2

    def take_next():
        try:
            next(batches)
        except RuntimeError as e:
            outcome.append(e)

    waiting = threading.Thread(target=take_next, daemon=True)
    waiting.start()
    waiting.join(30)
    assert outcome, "the rank still waits for its stuck worker after 30 s"
    assert guards.one_line(outcome[0], str(tmp_path)) == (
        "no micro-batch from this rank's data loader workers in 3 s (DIST_TIMEOUT_S): a worker is stuck (their stacks "
        "are above: a lock held at the fork, or a row's reading, tokenizing or collating), or ended"
    )
    assert re.search(r'File ".*test_train_ddp\.py", line \d+ in __getitem__', capfd.readouterr().err)


# ---------------------------------------------------------------- model
def test_the_vision_and_audio_embedders_are_left_out_as_memory_budget_counts(tiny_lora_model, tiny_model_path):
    """Text rows never run them: load_model drops them, and memory_budget's weights are the ones kept (the
    tiny default carries both, as the 12B does)."""
    base = tiny_lora_model.get_base_model()
    assert not any("embed_vision" in n or "embed_audio" in n for n, _ in base.named_parameters())
    shapes = memory_budget.param_shapes_from_path(tiny_model_path)
    assert any("embed_vision" in n for n in shapes) and any("embed_audio" in n for n in shapes)
    config = memory_budget.load_config(tiny_model_path)
    params = memory_budget.estimate(shapes, config, memory_budget.Layout(), seq_len=64)
    frozen = sum(p.numel() for p in base.parameters() if not p.requires_grad)
    frozen += sum(b.numel() for n, b in base.named_buffers() if n.endswith("layer_scalar"))  # in the checkpoint
    assert frozen == params["params"]["loaded"] < params["params"]["total"]


def test_adapters_only_on_the_text_decoder(tiny_lora_model):
    names = [n for n, p in tiny_lora_model.named_parameters() if p.requires_grad]
    assert names and all(".language_model." in n and "lora_" in n for n in names)
    assert not any("vision" in n or "audio" in n for n in names)
    config = tiny_lora_model.get_base_model().config.text_config
    for layer, kind in enumerate(config.layer_types):
        has_v = any(f"layers.{layer}.self_attn.v_proj.lora" in n for n in names)
        assert has_v == (kind == "sliding_attention")  # global layers: attention_k_eq_v, no v_proj
    assert "full_attention" in config.layer_types
    targeted = [
        m
        for n, m in tiny_lora_model.get_base_model().named_modules()
        if re.fullmatch(CPU.LORA_TARGETS, n) and hasattr(m, "base_layer")
    ]
    expected = sum(CPU.LORA_R * (m.base_layer.in_features + m.base_layer.out_features) for m in targeted)
    assert tiny_lora_model.get_nb_trainable_parameters()[0] == expected


@pytest.mark.parametrize("compiled", [False, True], ids=["checkpointed-chunks", "fused-chunks"])
def test_chunked_loss_equals_full_logits_loss(tokenizer, tiny_lora_model, compiled):
    rows = chat_data.load_conversations(str(SAMPLE_DATA))[:3]
    batch = PadCollate(tokenizer.pad_token_id)([chat_data.tokenize_conversation(tokenizer, r, 512, True) for r in rows])
    results = []
    for chunk in (0, 7):
        module = CausalLMLoss(tiny_lora_model, chunk, compiled=compiled).eval()
        tiny_lora_model.zero_grad(set_to_none=True)
        loss, n = module(**batch)
        (loss / n).backward()  # scaled, as forward_backward scales it
        grads = [p.grad.clone() for p in tiny_lora_model.parameters() if p.requires_grad]
        results.append((loss.detach(), n, grads))
    (full, n_full, g_full), (chunked, n_chunked, g_chunked) = results
    assert n_full == n_chunked == (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
    torch.testing.assert_close(chunked, full, rtol=1e-6, atol=0)
    for a, b in zip(g_chunked, g_full, strict=True):  # fp32 summation-order noise only, relative to the tensor's scale
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))
    # and the loss equals the model's own (HF) token-mean cross-entropy with softcapping
    reference = tiny_lora_model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
    ).loss
    torch.testing.assert_close(full / n_full, reference, rtol=1e-5, atol=0)


@pytest.mark.parametrize("compiled", [False, True], ids=["checkpointed-chunks", "fused-chunks"])
def test_micro_batch_without_targets_still_reaches_every_adapter(tokenizer, tiny_lora_model, compiled):
    """An assistant turn cut off by MAX_LEN leaves a micro-batch with no target: backward must still run
    (zero gradients on every adapter), or that rank would crash while the others wait in the all-reduce."""
    ids = torch.tensor(
        [
            chat_data.tokenize_conversation(tokenizer, chat_data.load_conversations(str(SAMPLE_DATA))[0], 32, True)[
                "input_ids"
            ]
        ]
    )
    tiny_lora_model.zero_grad(set_to_none=True)
    module = CausalLMLoss(tiny_lora_model, 64, compiled=compiled)
    loss, n = module(ids, torch.ones_like(ids), torch.full_like(ids, IGNORE_INDEX))
    loss.backward()
    assert n == 0 and loss.item() == 0.0
    grads = [p.grad for p in tiny_lora_model.parameters() if p.requires_grad]
    assert all(g is not None and not g.any() for g in grads)


# ---------------------------------------------------------------- real 2-rank jobs
@pytest.mark.parametrize("backend", BACKENDS)
def test_end_to_end_two_ranks(tmp_path, backend):
    data = write_rows(tmp_path / "train.jsonl", sample_rows(18 * RANKS + 1))  # 37 on 2 ranks: not divisible by 2*2*2
    out = tmp_path / "out"
    launched = time.monotonic()
    run = torchrun(
        ROOT / "train_ddp.py",
        env={
            "DATA_PATH": str(data),
            "OUTPUT_DIR": str(out),
            "MAX_LEN": "256",
            "MICRO_BATCH": "2",
            "ACCUM_STEPS": "2",
            "EPOCHS": "1",
            "NUM_WORKERS": "1",
        },
        backend=backend,
    )
    assert run.returncode == 0, run.output[-4000:]
    assert f"identical on all {RANKS} ranks" in run.output
    # the whole run's wall time, from the process's start (imports included), within the launch's
    since_launch = float(re.search(r"\| ([\d.]+) s since launch", run.output)[1])
    assert 2.0 < since_launch < time.monotonic() - launched
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    saves = [(r["step"], r["saved"]) for r in records if "saved" in r]
    assert saves == [(4, "checkpoint"), (4, "adapter")], saves  # the epoch's end, then the adapter: each timed
    records = [r for r in records if "saved" not in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # (37 // 2 ranks // 2 micro) // 2 accum, as at any RANKS
    assert records[0]["lr"] > 0  # warmup's first step trains
    assert "FutureWarning" not in run.output and run.output.count("Loading weights: 100%") == 1  # rank 0's bar only
    rows, left_out = 18 * RANKS + 1, 2 * RANKS + 1  # 16 a rank train (4 steps of 2x2), the rest is dropped
    summary = re.search(
        rf"data: {rows} rows(?: \(\d+ repeat an earlier row exactly\))?; of {rows} sampled, (\d+) longer than "
        rf"MAX_LEN=256 \((\d+) of (\d+) target tokens within 2 x MAX_LEN "
        rf"cut\), \d+ with no target left; {left_out} rows per epoch left out by drop_last",
        run.output,
    )
    assert summary and int(summary[3]) > sum(r["targets"] for r in records), run.output[:3000]
    assert re.search(r"adapter: \S+adapter +metrics: \S+metrics.jsonl +checkpoints: .*\nload it: PeftModel", run.output)
    assert json.loads((out / "config.json").read_text())["versions"]["torch"] == torch.__version__
    assert all(r["targets"] > 0 and r["tokens"] > r["targets"] and r["loss"] > 0 for r in records)
    assert {p.name for p in (out / "adapter").iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_short_rows_beside_long_ones_give_finite_gradients_on_gpu(tmp_path):
    """The realistic chat mix (tools/make_chat_mix.py) on the 12B cut to its first 6 layers, micro-batches
    of 4, eager, one GPU: short rows share a micro-batch with long ones, so their padding runs past the sliding
    window (1,024). With a padding mask in the sliding layers, steps 1, 3 and 5 had NaN gradients and were skipped
    (bench_results/issue25/call2: 7 of 60 steps, compiled and eager alike)."""
    subprocess.run([sys.executable, ROOT / "tools/make_chat_mix.py", tmp_path / "mix.jsonl", "480"], check=True)
    config = json.loads((ROOT / "configs" / "gemma-4-12b.json").read_text())
    text = config["text_config"]
    text.update(
        num_hidden_layers=6,
        layer_types=text["layer_types"][:6],
        per_layer_config={"05": text["per_layer_config"]["05"]},
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    run = torchrun(
        ROOT / "train_ddp.py",
        nproc=1,
        backend="nccl",
        timeout=300,
        env={
            "MODEL_CONFIG": str(tmp_path / "config.json"),
            "DATA_PATH": str(tmp_path / "mix.jsonl"),
            "OUTPUT_DIR": str(tmp_path / "out"),
            "MAX_LEN": "2048",
            "MAX_STEPS": "5",
            "MICRO_BATCH": "4",
            "ACCUM_STEPS": "2",
            "GRADIENT_CHECKPOINTING": "0",
        },
    )
    assert run.returncode == 0, run.output[-4000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["skipped"]) for r in records if "skipped" in r] == [(step, False) for step in range(1, 6)]


def test_steps_whose_rows_lost_every_target_to_max_len_skip_their_update_on_every_rank(tmp_path):
    """10 rows whose long prompt leaves no assistant token within MAX_LEN, 2 that keep theirs, 2 ranks of one
    row a step: at least 4 of the 6 steps have no target on any rank. Those skip their update on every rank
    (the count is all-reduced), log no loss, and the ranks end identical."""
    prompt = " ".join(["word"] * 400)
    lost = {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": "the answer"}]}
    rows = [lost] * 10 + [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Ok"}]}] * 2
    out = tmp_path / "out"
    env = {"DATA_PATH": str(write_rows(tmp_path / "x.jsonl", rows)), "OUTPUT_DIR": str(out), "MAX_LEN": "128"}
    env.update(EPOCHS="1", MICRO_BATCH="1", ACCUM_STEPS="1", NUM_WORKERS="0")
    run = torchrun(ROOT / "train_ddp.py", nproc=2, env=env)
    assert run.returncode == 0, run.output[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [(r["skipped"], r["loss"] is None) for r in records if "skipped" in r]
    assert [r["targets"] == 0 for r in records if "skipped" in r] == [skipped for skipped, _ in steps]
    assert all(skipped == no_loss for skipped, no_loss in steps) and sum(skipped for skipped, _ in steps) >= 4
    assert "steps skipped their update (no target token)" in run.output and "identical on all 2 ranks" in run.output


def test_gradients_equal_single_process_on_global_batch_with_one_allreduce_per_step(tmp_path):
    run = torchrun(ROOT / "tests" / "ddp_worker.py", "grad_equivalence", tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert len(set(result["lengths"])) == len(result["lengths"])  # samples of unequal lengths
    # fp32 summation order only: 1.1e-5 of the largest gradient on an AMD EPYC's CPU kernels, under 1e-5 on
    # others; a wrong loss normalisation or a missed all-reduce is off by far more (a factor, not the 5th digit)
    assert result["max_rel_grad_diff"] < 5e-5
    # Every gradient element is all-reduced exactly once per optimizer step: none during the
    # no_sync micro-batch, one bucketed pass (over the whole gradient) on the last micro-batch.
    assert result["allreduced_elements"] == result["trainable_elements"]
    assert result["allreduce_calls"] >= 1
    # optimizer_step clips after the all-reduce: the norm it returns is the single process's over the global batch
    # (the worker also checks AdamW stepped with that process's gradient scaled to GRAD_CLIP)
    assert result["reference_grad_norm"] > 10 * result["grad_clip"]  # a real clip
    assert result["grad_norm"] == pytest.approx(result["reference_grad_norm"], rel=1e-4)
    assert result["clipped_norm"] == pytest.approx(result["grad_clip"], rel=1e-4)
    # the worker's DDP is train_ddp.wrap_ddp's: gradients are views into the all-reduced buckets (no second copy
    # of them), and Gemma's constant buffers are not re-broadcast every forward
    assert result["grads_are_bucket_views"], "gradients copied beside DDP's buckets (gradient_as_bucket_view off?)"
    assert not result["buffers_synced_in_forward"], "DDP broadcasts the buffers every forward (broadcast_buffers on?)"


def test_each_rank_draws_its_own_dropout_masks_in_every_step(tmp_path):
    """A real job (train_ddp.main, recorded by tests/ddp_worker.py) whose 2 ranks train on the same row each
    step: the adapters were made under one seed on every rank, but each step's dropout masks must differ between
    the ranks (else the world's batch gets one mask, as if it were one rank's) and between the steps."""
    row = {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello there!"}]}
    env = {"DATA_PATH": str(write_rows(tmp_path / "same.jsonl", [row] * 4)), "LORA_DROPOUT": "0.5", "MAX_LEN": "64"}
    env.update(EPOCHS="1", MICRO_BATCH="1", ACCUM_STEPS="1", NUM_WORKERS="0", GRADIENT_CHECKPOINTING="0")
    run = torchrun(ROOT / "tests" / "ddp_worker.py", "dropout_masks", tmp_path, nproc=2, env=env)
    assert run.returncode == 0, run.output[-4000:]
    rank0, rank1 = (json.loads((tmp_path / f"masks_rank{r}.json").read_text()) for r in (0, 1))
    assert len(rank0) == len(rank1) == 2 and len(rank0[0]) == len(rank1[0]) == len(rank0[1]) > 0
    for step in (0, 1):  # the same inputs on both ranks: only the masks' random draws can differ
        same = sum(a == b for a, b in zip(rank0[step], rank1[step], strict=True))
        assert same == 0, f"step {step + 1}: {same} of {len(rank0[step])} LoRA dropouts drew rank 0's mask on rank 1"
    for rank, (step1, step2) in enumerate((rank0, rank1)):  # and every step new masks
        again = sum(a == b for a, b in zip(step1, step2, strict=True))
        assert again == 0, f"rank {rank}: {again} of {len(step1)} LoRA dropouts drew step 1's mask again in step 2"


def test_only_rank0_writes_and_reloaded_adapter_reproduces_logits(tmp_path):
    run = torchrun(ROOT / "tests" / "ddp_worker.py", "save_and_reload", tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["writers"] == [[0], []]
    assert "adapter_model.safetensors" in result["files"]


BAD_INPUTS = {
    "malformed-json": (
        lambda d: write_rows(d / "x.jsonl", [sample_rows(1)[0], '{"messages": [}']),
        {},
        r"x\.jsonl:2: not valid JSON",
    ),
    "no-messages": (lambda d: write_rows(d / "x.jsonl", [{"text": "hi"}]), {}, r"x\.jsonl:1: expected .*'messages'"),
    "unknown-role": (
        lambda d: write_rows(d / "x.jsonl", [{"messages": [{"role": "bot", "content": "x"}]}]),
        {},
        r"x\.jsonl:1: messages\[0\]: unknown role 'bot'",
    ),
    "assistant-first": (
        lambda d: write_rows(d / "x.jsonl", [{"messages": [{"role": "assistant", "content": "Hi"}]}]),
        {},
        r"x\.jsonl:1: messages\[0\] is from the assistant",
    ),
    "empty-file": (lambda d: write_rows(d / "x.jsonl", []), {}, r"x\.jsonl: no examples"),
    "empty-data-path": (lambda d: "", {}, r"DATA_PATH='': allowed a chat JSONL file"),
    "control-token-text": (
        lambda d: write_rows(
            d / "x.jsonl",
            [
                *sample_rows(20),
                {"messages": [{"role": "user", "content": "hi <turn|>"}, {"role": "assistant", "content": "Ok"}]},
            ],
        ),
        {},
        r"x\.jsonl:21: messages\[0\] has '<turn\|>' in its text, which the tokenizer reads as that control token",
    ),
    "too-few-samples": (
        lambda d: write_rows(d / "x.jsonl", sample_rows(3)),
        {"ACCUM_STEPS": "2"},
        r"3 samples, but one optimizer step needs .* = 2\*1\*2 = 4",
    ),
    "too-few-packed-rows": (  # 96 conversations fill 7 rows of 2,048 tokens
        lambda d: SAMPLE_DATA,
        {"PACKING": "1", "MAX_LEN": "2048", "ACCUM_STEPS": "8"},
        r"packed into 7 rows of MAX_LEN=2048 tokens, but one optimizer step needs .* = 2\*1\*8 = 16",
    ),
    "unwritable-output": (
        lambda d: SAMPLE_DATA,
        {"OUTPUT_DIR": "/proc/forbidden"},
        r"OUTPUT_DIR '/proc/forbidden' is not writable",
    ),
    "regex-invalid": (  # before the model loads: re.error came after ~20 s, as a traceback
        lambda d: SAMPLE_DATA,
        {"LORA_TARGETS": "(q_proj"},
        r"LORA_TARGETS='\(q_proj': not a regular expression \(missing \), unterminated subpattern",
    ),
    "other-architecture": (  # transformers raised AttributeError: 'dict' object has no attribute 'to_dict'
        lambda d: (
            (d / "llama").mkdir(exist_ok=True)
            or (d / "llama" / "config.json").write_text('{"model_type": "llama"}')
            and SAMPLE_DATA
        ),
        {"MODEL_ID": "__TMP__/llama"},
        r"MODEL_ID '.*/llama': config\.json says model_type 'llama'; this script fine-tunes Gemma 4",
    ),
    "regex-matches-nothing": (
        lambda d: SAMPLE_DATA,
        {"LORA_TARGETS": r".*\.nonexistent_proj"},
        r"LORA_TARGETS .* matches no Linear module",
    ),
    "not-utf8": (
        lambda d: (
            (d / "x.jsonl").write_bytes(
                SAMPLE_DATA.read_bytes().split(b"\n")[0] + b"\n" + '{"messages": "caf\u00e9"}'.encode("latin-1")
            )
            and d / "x.jsonl"
        ),
        {},
        r"x\.jsonl:2: not UTF-8 \(byte 0xe9 at column 18\); save the file as UTF-8",
    ),
    "missing-model-folder": (
        lambda d: SAMPLE_DATA,
        {"MODEL_ID": "/nonexistent/models/gemma"},
        r"MODEL_ID '/nonexistent/models/gemma': no such folder",
    ),
    "hub-id-offline": (
        lambda d: SAMPLE_DATA,
        {"MODEL_ID": "google/gemma-4-12B-it", "HF_HUB_OFFLINE": "1", "HF_HOME": "/nonexistent-hf-home"},
        r"MODEL_ID 'google/gemma-4-12B-it': not in the local hub cache, and HF_HUB_OFFLINE is set",
    ),
    "relative-path-online": (  # looks like a hub id: one quick question to the hub, not a minute of retries
        lambda d: SAMPLE_DATA,
        {"MODEL_ID": "models/missing-gemma", "HF_HUB_OFFLINE": "0", "HF_HOME": "/nonexistent-hf-home"},
        r"MODEL_ID 'models/missing-gemma': no such folder here, and (no such model on the hub|the hub did not answer)",
    ),
    "weights-truncated": (
        lambda d: damaged_model(d, "model.safetensors") and SAMPLE_DATA,
        {"MODEL_ID": "__TMP__/damaged"},
        r"MODEL_ID '\S+/damaged': cannot load the model: .*(incomplete|invalid|header|error)",
    ),
    "tokenizer-missing": (
        lambda d: damaged_model(d, "tokenizer.json") and SAMPLE_DATA,
        {"MODEL_ID": "__TMP__/damaged"},
        r"MODEL_ID '\S+/damaged': cannot load its tokenizer: ",
    ),
    "json-array": (
        lambda d: (d / "x.json").write_text(json.dumps([json.loads(r) for r in sample_rows(4)])) and d / "x.json",
        {},
        r"x\.json:1: a JSON array; this script reads JSON Lines, one object per line. Convert: python -c",
    ),
    "sharegpt": (
        lambda d: write_rows(d / "x.jsonl", [{"conversations": [{"from": "human", "value": "Hi"}]}]),
        {},
        r"x\.jsonl:1: expected .*'messages' list; this looks like ShareGPT: rename 'conversations' to 'messages'",
    ),
    "prompt-completion": (
        lambda d: write_rows(d / "x.jsonl", [{"prompt": "Hi", "completion": "Hello"}]),
        {},
        r"x\.jsonl:1: expected .*'messages' list; this looks like prompt/completion: write",
    ),
    "no-target-within-max-len": (
        lambda d: SAMPLE_DATA,
        {"MAX_LEN": "16"},
        r"no row keeps a target token within MAX_LEN=16 .*: raise MAX_LEN",
    ),
    "bad-constants": (
        lambda d: SAMPLE_DATA,
        {"MICRO_BATCH": "0", "LR": "abc", "LORA_DROPOUT": "1.5"},
        r"LR='abc': expected a number; MICRO_BATCH=0: allowed >= 1; LORA_DROPOUT=1.5: allowed in \[0, 1\)",
    ),
}


def damaged_model(folder: Path, name: str) -> Path:
    """A copy of the tiny model in folder/damaged whose file `name` is cut short (the weights: a download that
    stopped) or missing (anything else)."""
    model = folder / "damaged"
    shutil.copytree(TINY_MODEL, model)
    if name == "model.safetensors":
        os.truncate(model / name, 100_000)
    else:
        (model / name).unlink()
    return model


def ranks_started_by_hand(envs: list[dict], timeout: float, waiting: str) -> list[str]:
    """train_ddp.py once per environment in `envs` (rank r gets envs[r]), as torchrun would start each rank but
    without torchrun. Every rank must exit with code 2 within `timeout` s (else it is `waiting`). Their outputs."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "train_ddp.py")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for env in envs
    ]
    outputs = []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for every in procs:
                kill_tree(every)
            pytest.fail(f"rank {rank} did not exit within {timeout} s: {waiting}")
        assert proc.returncode == 2, out[-3000:]
        outputs.append(out)
    return outputs


def rank_env(rank: int, port: int, **settings) -> dict:
    """Rank `rank` of 2 on this machine (CPU, gloo), with `settings` on top of this process's environment."""
    env = {**os.environ, **launch_env(), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), **settings}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_clearly_on_every_rank_without_hanging(tmp_path, case):
    """Each rank of a 2-rank job is started ALONE (as torchrun would start it, but without its peer):
    had it reached init_process_group or any collective, it would wait for the missing rank until the
    timeout. Both exit at once with the same clear error: it is raised before the first collective."""
    make_data, env, message = BAD_INPUTS[case]
    settings = {
        "DATA_PATH": str(make_data(tmp_path)),
        "OUTPUT_DIR": str(tmp_path / "out"),
        "DIST_TIMEOUT_S": "120",
        **{k: v.replace("__TMP__", str(tmp_path)) for k, v in env.items()},
    }
    port = free_port()
    envs = [rank_env(rank, port, **settings) for rank in (0, 1)]
    for rank, out in enumerate(ranks_started_by_hand(envs, 60, "it waits for its peer (a collective)")):
        assert re.search(rf"^\[rank {rank}\] error: .*{message}", out, re.M), out[-3000:]


def test_ranks_started_with_different_settings_stop_together_at_the_first_collective(tmp_path):
    """A per-node export gives rank 1 another MICRO_BATCH (a hang at the first collective whose shape differs),
    LR (replicas that diverge until the drift check) and eval file (an eval loss over two different sets): both
    ranks stop at once, naming what differs."""
    evals = [tmp_path / "eval0.jsonl", tmp_path / "eval1.jsonl"]
    rows = SAMPLE_DATA.read_text().splitlines(keepends=True)
    evals[0].write_text("".join(rows[:4]))
    evals[1].write_text("".join(rows[4:8]))
    port, same = free_port(), {"OUTPUT_DIR": str(tmp_path / "out"), "NUM_WORKERS": "0", "MAX_LEN": "128"}
    envs = [
        rank_env(0, port, **same, EVAL_PATH=str(evals[0])),
        rank_env(1, port, **same, EVAL_PATH=str(evals[1]), MICRO_BATCH="2", ACCUM_STEPS="4", LR="1e-3"),
    ]
    every_rank_stops_untrained(
        envs,
        "the ranks train on, or wait, with other settings",
        r"the ranks were started with different settings \(by rank, "
        r"MICRO_BATCH: \[1, 2\]; ACCUM_STEPS: \[8, 4\]; LR: \[0\.0002, 0\.001\]\): give every rank the same "
        rf"environment; EVAL_PATH's content differs between ranks \(by rank: \[0\]: {re.escape(str(evals[0]))} "
        rf"\(sha256 [0-9a-f]{{12}}\); \[1\]: {re.escape(str(evals[1]))} \(sha256 [0-9a-f]{{12}}\)\): give every "
        r"node the same file",
        tmp_path / "out",
    )


def every_rank_stops_untrained(envs: list[dict], hang: str, error: str, out: Path) -> None:
    """Ranks started by hand with `envs` each end in one `error` line (a regex) at the first collective, and no
    step is trained in `out` (`hang`: what a failure to stop would mean)."""
    for rank, output in enumerate(ranks_started_by_hand(envs, 120, hang)):
        assert re.search(rf"^\[rank {rank}\] error: {error}$", output, re.M), output[-3000:]
    assert not (out / "metrics.jsonl").exists()  # not one step trained


def test_a_node_local_copy_of_the_data_that_differs_is_named_not_blamed_on_the_environment(tmp_path):
    """Every rank has the same settings; rank 1's node holds its own copies of the data (one row short: stale)
    and of the model (the same files at another path, which may differ by node). Both ranks stop at the first
    collective naming DATA_PATH's content, each rank's file, and what to do; the model copy is not blamed."""
    rows = SAMPLE_DATA.read_text().splitlines(keepends=True)
    stale, model = tmp_path / "node1" / "chat.jsonl", tmp_path / "node1" / "tiny-gemma4"
    shutil.copytree(TINY_MODEL, model)
    stale.write_text("".join(rows[:-1]))
    port, same = free_port(), {"OUTPUT_DIR": str(tmp_path / "out"), "NUM_WORKERS": "0", "MAX_LEN": "128"}
    envs = [rank_env(0, port, **same), rank_env(1, port, **same, DATA_PATH=str(stale), MODEL_ID=str(model))]
    every_rank_stops_untrained(
        envs,
        "the ranks train on different data",
        rf"DATA_PATH's content differs between ranks \(by rank: \[0\]: {re.escape(str(SAMPLE_DATA))} "
        rf"\(sha256 [0-9a-f]{{12}}\); \[1\]: {re.escape(str(stale))} \(sha256 [0-9a-f]{{12}}\)\): give every node "
        r"the same file",
        tmp_path / "out",
    )


def test_more_ranks_on_a_node_than_gpus_stop_every_rank_there_alike(monkeypatch):
    """torchrun --nproc_per_node=8 on a node with 2 GPUs: ranks 2-7 would fail alone ('invalid device ordinal')."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert [T.rank_device(r) for r in (0, 1)] == [torch.device("cuda", 0), torch.device("cuda", 1)]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    for local_rank in (0, 7):
        with pytest.raises(InputError) as refused:
            T.rank_device(local_rank)
        assert str(refused.value) == (
            "8 ranks on this node (torchrun --nproc_per_node=8), but it has 2 GPU(s) (CUDA_VISIBLE_DEVICES='0,1'): "
            "one rank per GPU, --nproc_per_node=2"
        )
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # a launcher that does not set it: the rank past the GPUs says so
    with pytest.raises(InputError, match=r"^LOCAL_RANK=2, but this node has 2 GPU\(s\): one rank per GPU$"):
        T.rank_device(2)


def test_a_gpu_without_bf16_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Tesla T4")
    with pytest.raises(InputError, match=r"^GPU 0 is a Tesla T4 \(compute capability 7\.5\): training runs in bf16"):
        T.rank_device(0)


def test_a_plain_run_takes_a_free_port(monkeypatch):
    """Two plain `python train_ddp.py` on one machine: a fixed default port would make the second fail late."""
    ports = []
    with socket.socket() as first_job:
        for _ in range(2):
            monkeypatch.setattr(
                os, "environ", {k: v for k, v in os.environ.items() if k not in settings.LAUNCHER_VARIABLES}
            )
            assert T.rank_info() == (0, 0, 1)  # it sets RANK etc. in this copy of the environment only
            ports.append(int(os.environ["MASTER_PORT"]))
            if len(ports) == 1:
                first_job.bind(("127.0.0.1", ports[0]))  # the first job's store holds its port
                first_job.listen()
    assert ports[1] != ports[0]


@pytest.mark.parametrize("fault", ["peer-never-comes", "port-in-use"])
def test_a_process_group_that_does_not_form_is_one_line(tmp_path, monkeypatch, fault):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1] if fault == "port-in-use" else free_port()
        world = "2" if fault == "peer-never-comes" else "1"
        env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(
            InputError, match=rf"the process group of {world} ranks at 127\.0\.0\.1:{port} did not form"
        ) as e:
            T.init_distributed(torch.device("cpu"), str(tmp_path), timeout_s=3)
    # a peer that never came may have failed before joining (its node-local input): its node's log says why
    assert str(e.value).endswith(
        "(a rank may have stopped before joining: read every node's log for its error; else, every rank started "
        "with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE? a port no other job holds?)"
    )


def test_gloo_ranks_that_cannot_connect_after_a_torchrun_restart_are_one_line(tmp_path, monkeypatch):
    """After torchrun --max-restarts restarted the group, gloo's connect often fails (plain torch too): a page of
    'Connection refused' and a traceback, where running the command again resumes."""
    refused = "[gloo/transport/tcp/pair.cc:144] Gloo connectFullMesh failed with [...] Connection refused\nmore"

    def connect(*args, **kwargs):
        raise RuntimeError(refused)

    monkeypatch.setattr(dist, "init_process_group", connect)
    env = dict(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999", TORCHELASTIC_RESTART_COUNT="1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InputError) as e:
        T.init_distributed(torch.device("cpu"), str(tmp_path), timeout_s=3)
    assert str(e.value) == (
        f"the process group of 2 ranks at 127.0.0.1:29999 did not form: gloo could not connect the ranks "
        f"({refused.splitlines()[0]}) (a torchrun restart: on gloo it often fails so; running the command again "
        f"resumes)"
    )


def test_a_model_that_does_not_fit_the_gpu_is_one_line_naming_a_memory_target(tmp_path, monkeypatch, capsys):
    """Out of memory while the weights load (before the process group forms): one line, as after it."""
    launched = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for name, value in {**launched, "OUTPUT_DIR": str(tmp_path / "out")}.items():
        monkeypatch.setenv(name, value)

    def load_model(*_):
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total capacity of 79.19 GiB of which 0.75 GiB "
            "is free. Including non-PyTorch memory, this process has 78.43 GiB memory in use. Of the allocated ..."
        )

    monkeypatch.setattr(T, "load_model", load_model)
    monkeypatch.setattr(sys, "argv", ["train_ddp.py"])
    monkeypatch.setattr(guards.GracefulStop, "install", lambda *_: None)  # pytest's own signals stay pytest's
    with pytest.raises(SystemExit) as ended:
        T.run()
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "[rank 0] error: out of GPU memory (tried to allocate 1.50 GiB on a 79.19 GiB GPU with 78.43 GiB in use): "
        "MEMORY_TARGET_GIB=73 makes the planner choose a layout predicted to fit, or lower "
        "MICRO_BATCH or MAX_LEN; python memory_budget.py MODEL_ID shows what each part needs"
    )


def test_lora_targets_that_match_more_than_linear_layers_are_refused():
    """'.*' matches every Linear, and the model itself: PEFT raised a ValueError printing the whole model."""
    with pytest.raises(
        InputError, match=r"LORA_TARGETS '\.\*' also matches \d+ modules that are not Linear layers \(\(the whole"
    ):
        T.add_lora(T.load_model(CPU, torch.device("cpu")), cpu_config(LORA_TARGETS=".*"))


def test_an_eval_set_without_a_target_token_reports_no_loss(tokenizer, tiny_lora_model, tmp_path):
    """Every answer past MAX_LEN: a loss of 0 (ppl 1.00) would read as a perfect model."""
    rows = [[{"role": "user", "content": "word " * 300}, {"role": "assistant", "content": "Ok"}]] * 2
    dataset = chat_data.ChatDataset(rows, tokenizer, max_len=64, assistant_only=True)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = None
    try:
        model = torch.nn.parallel.DistributedDataParallel(CausalLMLoss(tiny_lora_model, 0))
        result = T.evaluate(model, dataset, PadCollate(tokenizer.pad_token_id, 64), torch.device("cpu"), 1)
    finally:
        del model  # first: DDP's reducer holds the group, and freed after it is destroyed it can hang (gloo)
        dist.destroy_process_group()
    assert result == {"eval_loss": None, "eval_ppl": None, "eval_targets": 0}


def test_an_evaluation_a_stop_left_due_is_not_run_once_eval_path_is_dropped(capsys):
    """A resume may unset EVAL_PATH: the evaluation the checkpoint says is due has nothing to run on then."""
    progress = {"step": 3, "eval_due": True}
    assert T.evaluate_if_due(None, None, None, torch.device("cpu"), 1, None, progress, None, stopping=False) is False
    assert "eval_due" not in progress  # nor is it due any more: a stop in the last step saves the adapter then
    assert capsys.readouterr().out == "the evaluation due at step 3 is not run: EVAL_PATH is not set any more\n"


def test_an_argument_to_the_script_fails_at_once_instead_of_being_ignored(tmp_path):
    run = subprocess.run(
        [sys.executable, str(ROOT / "train_ddp.py"), "--lr", "0.5"],
        cwd=tmp_path,
        env={**os.environ, **launch_env()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and not (tmp_path / "out").exists(), run.stdout[-2000:] + run.stderr[-2000:]
    assert (
        "error: train_ddp.py takes no arguments (got --lr 0.5): settings are environment variables, set before "
        "the command, e.g. LR=0.5 torchrun" in run.stderr
    )


def test_the_planner_says_which_of_your_settings_it_replaced(capsys):
    cfg, sources = settings.read(T.Config, T.ALLOWED, {"MEMORY_TARGET_GIB": "40", "MICRO_BATCH": "4", "LR": "1e-4"})
    planned, _ = T.plan(cfg, sources, 1, torch.device("cpu"))
    assert planned.MICRO_BATCH != 4  # the planner keeps MICRO_BATCH x ACCUM_STEPS, not the user's MICRO_BATCH
    assert "warning: MEMORY_TARGET_GIB=40.0 chooses the layout, over your MICRO_BATCH=4" in capsys.readouterr().out


def test_without_torchrun_it_says_how_to_launch_and_still_trains(tmp_path):
    env = {**os.environ, **launch_env(), "OUTPUT_DIR": str(tmp_path / "out"), "MASTER_PORT": str(free_port())}
    env.update(MAX_STEPS="1", ACCUM_STEPS="1", NUM_WORKERS="0", MAX_LEN="128")
    run = subprocess.run(
        [sys.executable, str(ROOT / "train_ddp.py")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith(
        "not started by torchrun: training as one process. For N GPUs: torchrun --nproc_per_node=N train_ddp.py\n"
    )
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()
    assert re.search(r"^adapter checksum [0-9a-f]{16} \| saved to ", run.stdout, re.M), run.stdout[-2000:]


# ---------------------------------------------------------------- optimisations compute the same thing
def loss_and_grads(tokenizer, bf16: bool = False, fused_loss: bool = False, **constants):
    """Loss sum and LoRA gradients of one micro-batch of 3 samples, with train_ddp constants set; fused_loss: the
    compiled loss chunks (lm_loss.LinearCrossEntropy) without COMPILE_LAYERS' compiled decoder layers."""
    plain = {"LORA_DROPOUT": 0.0, "CE_CHUNK_TOKENS": 0, "GRADIENT_CHECKPOINTING": 0, "LORA_BF16_INPUTS": False}
    cfg = cpu_config(**{**plain, **constants})
    rows = chat_data.load_conversations(str(SAMPLE_DATA))[3:6]
    batch = PadCollate(tokenizer.pad_token_id, constants.get("PAD_TO_MULTIPLE", 1))(
        [chat_data.tokenize_conversation(tokenizer, r, 512, True) for r in rows]
    )
    torch.manual_seed(0)
    base = T.load_model(cfg, torch.device("cpu"))
    model = nonzero_lora_b(T.add_lora(base.to(torch.bfloat16) if bf16 else base, cfg))
    module = CausalLMLoss(model, cfg.CE_CHUNK_TOKENS, compiled=cfg.COMPILE_LAYERS or fused_loss).train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss, n = module(**batch)
    loss.backward()
    return (
        loss.detach().float(),
        int(n),
        [p.grad.float() for _, p in sorted(model.named_parameters()) if p.requires_grad],
    )


def assert_same(a, b, rtol):
    (loss_a, n_a, grads_a), (loss_b, n_b, grads_b) = a, b
    assert n_a == n_b
    torch.testing.assert_close(loss_a, loss_b, rtol=rtol, atol=0)
    for ga, gb in zip(grads_a, grads_b, strict=True):  # relative to each tensor's scale
        assert float((ga - gb).norm()) <= rtol * float(gb.norm()), float((ga - gb).norm() / gb.norm())


@pytest.mark.parametrize(
    "lever",
    [
        {"CE_CHUNK_TOKENS": 64},
        {"PAD_TO_MULTIPLE": 64},
        {"GRADIENT_CHECKPOINTING": 1},
        {"GRADIENT_CHECKPOINTING": 2},
        {"GRADIENT_CHECKPOINTING": 1, "CHECKPOINT_OFFLOAD": True},  # host memory, unpinned on a CPU
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_optimisation_gives_the_plain_loss_and_gradients(tokenizer, lever):
    assert_same(loss_and_grads(tokenizer, **lever), loss_and_grads(tokenizer), rtol=1e-5)


def test_bf16_lora_inputs_match_pefts_fp32_inputs_under_autocast(tokenizer):
    fast = loss_and_grads(tokenizer, bf16=True, LORA_BF16_INPUTS=True)
    plain = loss_and_grads(tokenizer, bf16=True, LORA_BF16_INPUTS=False)
    assert_same(fast, plain, rtol=2e-2)  # the adapter matmuls ran in bf16 either way; only casts moved


def test_bf16_chunked_loss_matches_the_full_logits_loss_under_autocast(tokenizer):
    """Compiled, the chunked loss computes its gradient itself (lm_loss.LinearCrossEntropy): in BF16 it must do the
    LM head's matmuls as autocast does them for the full-logits loss."""
    chunked = loss_and_grads(tokenizer, bf16=True, fused_loss=True, CE_CHUNK_TOKENS=64)
    assert_same(chunked, loss_and_grads(tokenizer, bf16=True), rtol=2e-2)


def test_compiled_layers_give_the_eager_loss_and_gradients(tokenizer):
    """The compiled decoder layers, checkpointed and offloaded, and the compiled loss chunks. The checkpoint
    wraps the compiled layer: inside it, the offload would break the layer out of its graph (run eagerly)."""
    torch._dynamo.utils.counters.clear()
    compiled = loss_and_grads(
        tokenizer, COMPILE_LAYERS=True, GRADIENT_CHECKPOINTING=1, CHECKPOINT_OFFLOAD=True, CE_CHUNK_TOKENS=64
    )
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    assert_same(compiled, loss_and_grads(tokenizer), rtol=1e-4)


def test_an_offloaded_layer_input_comes_back_as_it_left():
    """Its values, and its requires_grad: without it the compiled layer's recompute traces another graph than
    its forward did, which saves other tensors."""
    layer_input = torch.randn(2, 8, 16, requires_grad=True) * 1.0
    back = T.from_host(T.to_host(layer_input))
    assert back.requires_grad and torch.equal(back, layer_input)
    assert back.untyped_storage().data_ptr() != layer_input.untyped_storage().data_ptr()  # a copy, not the tensor
    assert not T.from_host(T.to_host(layer_input.detach())).requires_grad


def test_a_step_without_a_target_token_applies_no_update():
    """Rows whose assistant turns MAX_LEN cut off can make a step with no target on any rank: its gradient is
    zero, which AdamW's momentum from earlier steps would still turn into an update."""
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.AdamW([weight], lr=0.1, weight_decay=0.0)
    scheduler = T.lr_schedule(optimizer, CPU, total_steps=10, steps_taken=0)
    weight.grad = torch.ones(4)
    optimizer.step()  # momentum
    before = weight.detach().clone()
    weight.grad = torch.zeros(4)
    assert T.optimizer_step(optimizer, scheduler, [weight], CPU, 0.0, 0, step=2)[1] == "no target token"
    assert torch.equal(weight, before)
    weight.grad = torch.zeros(4)  # the same zero gradient in a step with targets: momentum moves the weight
    assert T.optimizer_step(optimizer, scheduler, [weight], CPU, 0.0, 5, step=3)[1] is None
    assert not torch.equal(weight, before)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
        ),
    ],
)
def test_optimizer_state_on_the_host_takes_the_same_steps_and_resumes(device):
    """OPTIMIZER_OFFLOAD: between steps AdamW's state is in (pinned) host memory, not on the device, also right
    after a resume's load_state_dict; the steps are bitwise those with the state on the device."""
    torch.manual_seed(0)
    start = [torch.randn(64, 16, device=device), torch.randn(16, device=device)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(4)]

    stepped = []  # the state tensors each step left, before the offload's own hook (registered after) ran

    def adamw(params, state=None, on_host=True):
        optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, fused=device == "cuda")
        optimizer.register_step_post_hook(
            lambda o, *_: stepped.append([v for s in o.state.values() for v in s.values()])
        )
        if state is not None:
            optimizer.load_state_dict(state)
        if on_host:
            T.optimizer_state_on_host(optimizer)
        return optimizer

    def train(params, optimizer, steps):
        for step_grads in steps:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def on_host(optimizer) -> bool:
        kept = [v for state in optimizer.state.values() for v in state.values()]
        assert len(kept) == 3 * len(start)  # step, exp_avg, exp_avg_sq
        copies = not stepped or all(a is not b for a, b in zip(kept, stepped[-1], strict=True))  # (also on a CPU)
        return copies and all(v.device.type == "cpu" and (v.is_pinned() or device == "cpu") for v in kept)

    reference = [p.clone().requires_grad_() for p in start]
    train(reference, adamw(reference, on_host=False), grads)
    params = [p.clone().requires_grad_() for p in start]
    optimizer = adamw(params)
    train(params, optimizer, grads[:2])
    assert on_host(optimizer)
    resumed = [p.detach().clone().requires_grad_() for p in params]
    resumed_optimizer = adamw(resumed, optimizer.state_dict())
    assert on_host(resumed_optimizer)
    train(resumed, resumed_optimizer, grads[2:])
    for ours, theirs in zip(resumed, reference, strict=True):
        assert torch.equal(ours, theirs)


def test_checkpointed_compiled_layers_stay_within_the_recompile_limit(tokenizer, tmp_path):
    """12 layers (2 global), forward and recompute, at two padded widths: within torch's 8 compiles per code
    object, because the layers that write shared_kv_states (its contents differ in the recompute) run eagerly.
    Past the limit layers silently run eagerly, and a recompute may save other tensors than its forward did."""
    config = json.loads((TINY_MODEL / "config.json").read_text())
    text = config["text_config"]
    text["num_hidden_layers"], text["layer_types"] = 12, text["layer_types"] * 2
    text["per_layer_config"] = {**text["per_layer_config"], "11": text["per_layer_config"]["5"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for width in (1, 64):
            loss_and_grads(
                tokenizer,
                MODEL_CONFIG=str(tmp_path / "config.json"),
                COMPILE_LAYERS=True,
                GRADIENT_CHECKPOINTING=1,
                PAD_TO_MULTIPLE=width,
            )


def test_checkpointed_layers_recompute_the_same_dropout_masks(tokenizer):
    """Backward runs a checkpointed layer again: its LoRA dropout must draw the masks of the first pass, or the
    gradients belong to another forward. (Compiled, the layers draw other masks with checkpointing than without,
    so only eager layers compare.)"""
    kept, recomputed = (loss_and_grads(tokenizer, LORA_DROPOUT=0.3, GRADIENT_CHECKPOINTING=every) for every in (0, 1))
    assert_same(recomputed, kept, rtol=1e-5)


def test_length_grouping_keeps_every_optimizer_steps_samples_and_cuts_padding(tokenizer):
    dataset = chat_data.ChatDataset(chat_data.load_conversations(str(SAMPLE_DATA)), tokenizer, 2048, True)
    window = 4 * 4
    collate = PadCollate(tokenizer.pad_token_id)
    plain, grouped = (
        [
            i
            for b in T.train_loader(
                Indices(len(dataset), dataset.lengths),
                cpu_config(MICRO_BATCH=4, ACCUM_STEPS=4, NUM_WORKERS=0, GROUP_BY_LENGTH=grouping),
                1,
                2,
                5,
                0,
                None,
            )
            for i in b.tolist()
        ]
        for grouping in (False, True)
    )
    assert len(plain) == len(grouped)
    for start in range(0, len(plain), window):  # same samples in every optimizer step
        assert sorted(plain[start : start + window]) == sorted(grouped[start : start + window])

    def padding(order):
        batches = [collate([dataset[i] for i in order[j : j + 4]]) for j in range(0, len(order), 4)]
        return 1 - sum(int(b["attention_mask"].sum()) for b in batches) / sum(
            b["attention_mask"].numel() for b in batches
        )

    assert padding(grouped) < 0.5 * padding(plain)
