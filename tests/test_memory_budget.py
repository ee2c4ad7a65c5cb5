"""memory_budget.py: SPEC's worked figures from the 12B config, the safetensors header reader, LoRA
counts against PEFT, the activation model against autograd's saved tensors, and the CLI."""

import collections
import dataclasses
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import usage_error
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from transformers.models.gemma4_unified import Gemma4UnifiedConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # memory_budget.py lives at the repo root
import memory_budget as mb  # noqa: E402
import train_ddp as T  # noqa: E402

CONFIG_12B = ROOT / "configs" / "gemma-4-12b.json"
GB, GiB = mb.GB, mb.GiB


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def shapes_12b():
    """Names, shapes and dtypes of the 12B, from its config built on the meta device."""
    return mb.param_shapes_from_path(CONFIG_12B)


@pytest.fixture(scope="module")
def text_12b():
    return json.loads(CONFIG_12B.read_text())["text_config"]


def write_header_only(path: Path, shapes: dict) -> None:
    """A safetensors file with a real header and no data: the file is extended sparsely to its full size."""
    header, offset = {}, 0
    for name, (shape, dtype) in shapes.items():
        size = mb._numel(shape) * mb.DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)


@pytest.fixture(scope="module")
def header_only_12b(tmp_path_factory, shapes_12b):
    """The 12B as a sharded checkpoint folder (index + 2 shards) whose shards hold headers only."""
    folder = tmp_path_factory.mktemp("gemma-4-12b")
    names = list(shapes_12b)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for file, keys in shards.items():
        write_header_only(folder / file, {k: shapes_12b[k] for k in keys})
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(CONFIG_12B.read_text())
    return folder


def budget(
    shapes, text, *, micro_batch=1, ckpt_every=1, offload=False, ce_chunk_tokens=0, optimizer_offload=False, **kw
):
    """SPEC's reference layout unless told otherwise: every layer checkpointed, the loss over all logits."""
    layout = mb.Layout(
        micro_batch=micro_batch,
        ckpt_every=ckpt_every,
        offload=offload,
        ce_chunk_tokens=ce_chunk_tokens,
        optimizer_offload=optimizer_offload,
    )
    return mb.estimate(shapes, text, layout, **{"seq_len": 2048, **kw})


# ---------------------------------------------------------------- SPEC's figures, 12B


def test_12b_config_is_the_spec_architecture(text_12b):
    assert json.loads(CONFIG_12B.read_text())["model_type"] == "gemma4_unified"
    t = text_12b
    assert (t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"]) == (3840, 15360, 48)
    assert (t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]) == (16, 8, 256)
    assert (t["vocab_size"], t["sliding_window"], t["final_logit_softcapping"]) == (262144, 1024, 30.0)
    assert t["attention_k_eq_v"] and t["tie_word_embeddings"]
    assert t["layer_types"].count("full_attention") == 8


def test_12b_parameter_counts(shapes_12b, text_12b):
    p = budget(shapes_12b, text_12b)["params"]
    assert round(p["total"] / 1e9, 3) == 11.975  # SPEC: a header read of the 12B layout (the seed counted 11.96B)
    assert round(p["under_language_model"] / 1e9, 3) == 11.923
    assert shapes_12b["model.language_model.embed_tokens.weight"] == ((262144, 3840), "BF16")
    assert p["by_group"]["embeddings"] == 262144 * 3840
    assert p["by_group"]["vision"] > 0 and p["by_group"]["audio"] > 0
    assert p["by_dtype"] == {"BF16": p["total"]}


def test_12b_lora_count_skips_missing_v_proj(shapes_12b, text_12b):
    r = budget(shapes_12b, text_12b)
    assert r["lora_params"] == 65_634_304
    assert r["lora_params"] / r["params"]["total"] == pytest.approx(0.0055, abs=0.0001)
    assert r["lora_modules"] == 48 * 7 - 8  # the 8 global layers have k_proj but no v_proj
    lora = mb.lora_params(shapes_12b)
    assert "model.language_model.layers.5.self_attn.v_proj" not in lora
    assert not any("embed_vision" in m or "embed_audio" in m for m in lora)


def test_header_only_checkpoint_gives_the_same_shapes_and_budget(header_only_12b, shapes_12b, text_12b):
    assert (header_only_12b / "model-00001-of-00002.safetensors").stat().st_size > 10 * GB  # sparse
    assert mb.param_shapes_from_path(header_only_12b) == shapes_12b
    text = mb.load_config(header_only_12b)["text_config"]
    assert budget(mb.param_shapes_from_path(header_only_12b), text) == budget(shapes_12b, text_12b)


def test_12b_lora_fits_a_48gb_card_with_checkpointing(shapes_12b, text_12b):
    r = budget(shapes_12b, text_12b, gpu_mem_gb=48)
    assert 35 * GB <= r["total_bytes"] <= 40 * GB
    assert r["peak_bytes"] == sum(r["peak_breakdown"].values())
    assert r["fits"] and r["strategy"] == "DDP"
    p = r["params"]  # SPEC: the 12B is 22.3 GiB of BF16; train_ddp keeps it without the vision/audio embedders
    assert 2 * p["total"] / GiB == pytest.approx(22.3, abs=0.05)
    assert (
        r["bytes"]["frozen weights"]
        == 2 * p["loaded"]
        == 2 * (p["total"] - p["by_group"]["vision"] - p["by_group"]["audio"])
    )
    assert r["bytes"]["gradients (FP32)"] == pytest.approx(0.26 * GB, rel=0.02)


def test_logits_and_cross_entropy_buffers_are_6_to_9_gb_at_2048(shapes_12b, text_12b):
    r = budget(shapes_12b, text_12b)
    assert 6 * GB <= r["logits_ce_bytes"] <= 9 * GB
    assert r["peak_phase"] == "cross-entropy backward"
    assert budget(shapes_12b, text_12b, seq_len=4096)["logits_ce_bytes"] == 2 * r["logits_ce_bytes"]
    micro4 = dict(micro_batch=4, seq_len=2048)
    chunked = budget(shapes_12b, text_12b, ce_chunk_tokens=4096, **micro4)  # train_ddp.py's CE_CHUNK_TOKENS
    assert chunked["logits_ce_bytes"] == budget(shapes_12b, text_12b, **micro4)["logits_ce_bytes"] / 2
    assert chunked["logits_ce_unchunked_bytes"] == budget(shapes_12b, text_12b, **micro4)["logits_ce_bytes"]


def test_checkpointing_trades_activations(shapes_12b, text_12b):
    on, off = budget(shapes_12b, text_12b), budget(shapes_12b, text_12b, ckpt_every=0)
    assert on["activations_ckpt_bytes"] < 0.1 * on["activations_no_ckpt_bytes"]
    assert off["peak_bytes"] - on["peak_bytes"] > 25 * GB
    assert sum(on["activation_terms"].values()) == sum(on["layer_saved_bytes"])


def test_the_optimizer_offload_takes_adamws_state_off_the_peak_and_back_for_the_step(shapes_12b, text_12b):
    frugal = dict(offload=True, ce_chunk_tokens=256)
    on_gpu, on_host = (budget(shapes_12b, text_12b, **frugal, optimizer_offload=o) for o in (False, True))
    state = 8 * on_gpu["lora_params"]  # two FP32 moments per adapter parameter
    assert on_gpu["peak_bytes"] - on_host["peak_bytes"] == state
    assert on_host["peak_phase"] == on_gpu["peak_phase"] != "optimizer step"
    # the step itself, with the state over from the host, is everything that persists: no activation is left
    step = budget(shapes_12b, text_12b, **frugal, optimizer_offload=True, seq_len=8)
    assert step["peak_phase"] == "optimizer step"
    assert step["peak_bytes"] == sum(on_gpu["bytes"].values()) + mb.CUBLAS_WORKSPACE_BYTES
    # a card just too small: what FSDP/ZeRO would shard is the gradients alone, the AdamW state being on the host
    card = (on_host["total_bytes"] - on_host["grad_bytes"] / 2) / GiB
    tight = budget(shapes_12b, text_12b, **frugal, optimizer_offload=True, gpu_mem_gb=card)
    assert tight["strategy"] == "FSDP/ZeRO"
    assert f"optimizer state ({tight['grad_bytes'] / GiB:.1f} GiB)" in tight["strategy_reason"], tight[
        "strategy_reason"
    ]


def test_full_finetuning_is_16_bytes_per_param_and_needs_sharding(shapes_12b, text_12b):
    assert mb.full_finetune_bytes(0.6e9) == 9.6e9
    assert mb.full_finetune_bytes(0.6e9) / GiB == pytest.approx(8.94, abs=0.005)
    full = budget(shapes_12b, text_12b, full=True, world_size=8)
    assert full["full_finetune_bytes"] == pytest.approx(191e9, rel=0.01)
    assert sum(full["bytes"].values()) == full["full_finetune_bytes"]
    assert not full["fits"] and full["strategy"] == "FSDP/ZeRO"
    assert budget(shapes_12b, text_12b, world_size=8)["strategy"] == "DDP"


def test_weights_beyond_the_card_need_tensor_or_pipeline_parallelism(shapes_12b, text_12b):
    r = budget(shapes_12b, text_12b, gpu_mem_gb=16)
    assert not r["fits"] and r["strategy"] == "TP/PP"


def test_allreduce_bytes_and_time(shapes_12b, text_12b):
    r = budget(shapes_12b, text_12b, world_size=8)
    assert r["allreduce_ring_factor"] == 1.75
    assert r["allreduce_bytes"] == pytest.approx(0.46 * GB, rel=0.01)
    assert r["allreduce_seconds"] == pytest.approx(0.005, abs=0.0005)
    emb = budget(shapes_12b, text_12b, world_size=8, train_embeddings=True)
    assert 3.5 * GB < emb["allreduce_bytes"] < 5 * GB  # about ten times the LoRA-only all-reduce
    assert 8 < emb["allreduce_bytes"] / r["allreduce_bytes"] < 12
    assert budget(shapes_12b, text_12b)["allreduce_bytes"] == 0  # a single GPU has nothing to reduce


def test_global_batch_counts_data_parallel_ranks_only(shapes_12b, text_12b):
    r = budget(shapes_12b, text_12b, world_size=8, tp=2, micro_batch=2, accum=8)
    assert r["settings"]["dp"] == 4 and r["global_batch"] == 64
    with pytest.raises(ValueError, match="multiple"):
        budget(shapes_12b, text_12b, world_size=6, tp=4)


def test_report_is_a_readable_table(shapes_12b, text_12b):
    text = mb.format_report(budget(shapes_12b, text_12b, world_size=8))
    for needle in (
        "65,634,304",
        "frozen weights",
        "AdamW state",
        "logits + cross-entropy buffers",
        "without checkpointing",
        "allocator margin",
        "Strategy: DDP",
        "1.75",
        "Global batch",
        "GiB",
    ):
        assert needle in text


# ---------------------------------------------------------------- header reader vs the safetensors library


def test_header_reader_matches_safetensors_file(tmp_path):
    tensors = {
        "a.weight": torch.zeros(3, 5, dtype=torch.bfloat16),
        "b": torch.zeros(7, dtype=torch.float32),
        "c.idx": torch.zeros(2, 2, 2, dtype=torch.int64),
        "d": torch.zeros((), dtype=torch.float16),
    }
    save_file(tensors, tmp_path / "x.safetensors", metadata={"format": "pt"})
    assert mb.read_safetensors_header(tmp_path / "x.safetensors") == {
        "a.weight": ((3, 5), "BF16"),
        "b": ((7,), "F32"),
        "c.idx": ((2, 2, 2), "I64"),
        "d": ((), "F16"),
    }


def test_sharded_and_unsharded_checkpoints_read_alike(tmp_path, tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    sharded, unsharded = mb.param_shapes_from_path(tmp_path), mb.param_shapes_from_path(tiny_model_path)
    assert sharded == unsharded
    in_memory = mb.param_shapes_from_model(model)  # checkpoint keys renamed to parameter names
    assert {k: unsharded[k] for k in in_memory} == in_memory
    assert all(k.endswith("layer_scalar") for k in set(unsharded) - set(in_memory))  # persistent buffers


def test_config_alone_is_built_on_the_meta_device(tmp_path, tiny_model_path):
    (tmp_path / "config.json").write_text((tiny_model_path / "config.json").read_text())
    in_memory = mb.param_shapes_from_model(AutoModelForCausalLM.from_pretrained(tiny_model_path))
    assert mb.param_shapes_from_path(tmp_path) == in_memory
    assert mb.param_shapes_from_path(tmp_path / "config.json") == in_memory


def test_hub_id_uses_header_metadata_only(monkeypatch, tiny_model_path):
    """Offline stand-in for huggingface_hub's two calls: config.json and the safetensors header metadata."""
    from types import SimpleNamespace as NS

    import huggingface_hub

    header = mb.read_safetensors_header(tiny_model_path / "model.safetensors")
    tensors = {name: NS(shape=list(shape), dtype=dtype) for name, (shape, dtype) in header.items()}
    monkeypatch.setattr(
        huggingface_hub,
        "get_safetensors_metadata",
        lambda repo: NS(files_metadata={"model.safetensors": NS(tensors=tensors)}),
    )
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, file: tiny_model_path / file)
    assert mb.param_shapes_from_path("google/tiny-gemma4") == mb.param_shapes_from_path(tiny_model_path)


# ---------------------------------------------------------------- LoRA counts vs PEFT


@pytest.mark.parametrize(
    "targets",
    [
        mb.DEFAULT_TARGETS,
        r".*\.(q_proj|v_proj)",
        r".*language_model.*mlp\.\w+_proj",
        r".*embed_vision\..*(patch_dense|embedding_projection)|.*embed_audio\.embedding_projection",
        "all-linear",
        ["q_proj", "o_proj", "down_proj"],
    ],
)
@pytest.mark.parametrize("r", [1, 8, 16])
def test_lora_count_equals_peft(tiny_model_path, targets, r):
    """On the model as train_ddp loads it (no vision or audio embedders): targets only they matched match
    nothing, for PEFT and for the budget."""
    shapes = mb.param_shapes_from_path(tiny_model_path)
    text = mb.load_config(tiny_model_path)["text_config"]
    model = T.load_model(T.Config(MODEL_ID=str(tiny_model_path), ATTENTION_KERNEL="sdpa"), torch.device("cpu"))
    try:
        expected = get_peft_model(model, LoraConfig(r=r, target_modules=targets)).get_nb_trainable_parameters()[0]
    except ValueError:  # "Target modules ... not found in the base model"
        with pytest.raises(ValueError, match="match no Linear module"):
            mb.estimate(shapes, text, mb.Layout(), seq_len=64, lora_r=r, targets=targets)
        return
    assert mb.estimate(shapes, text, mb.Layout(), seq_len=64, lora_r=r, targets=targets)["lora_params"] == expected


def test_trainable_embeddings_equal_peft_modules_to_save(tiny_model_path):
    shapes = mb.param_shapes_from_path(tiny_model_path)
    text = mb.load_config(tiny_model_path)["text_config"]
    ours = mb.estimate(shapes, text, mb.Layout(), seq_len=64, train_embeddings=True)["trainable_params"]
    config = LoraConfig(
        r=16, target_modules=mb.DEFAULT_TARGETS, modules_to_save=["embed_tokens", "lm_head"], ensure_weight_tying=True
    )
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path), config)
    assert ours == peft.get_nb_trainable_parameters()[0]


def test_targets_matching_nothing_are_an_error(tiny_model_path):
    shapes = mb.param_shapes_from_path(tiny_model_path)
    with pytest.raises(mb.ModelError, match="match no Linear"):
        mb.estimate(shapes, {"num_attention_heads": 4}, mb.Layout(), seq_len=64, targets=r".*nothing")


# ---------------------------------------------------------------- activation model vs autograd


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_saved_activations_match_autograd_on_cpu(compiled):
    """Sum every tensor autograd saves for backward in the decoder layers of a small gemma4_unified (BF16
    weights, BF16 autocast, PEFT LoRA), eager or each layer compiled as COMPILE_LAYERS does, and compare with
    the per-layer model. Dropout is off: on CPU it keeps an FP32 mask where CUDA keeps a 1-byte one."""
    torch.manual_seed(0)
    cfg = Gemma4UnifiedConfig(
        text_config=dict(
            vocab_size=512,
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            global_head_dim=128,
            num_global_key_value_heads=2,
            attention_k_eq_v=True,
            final_logit_softcapping=30.0,
            sliding_window=128,
        ),
        vision_config=dict(
            patch_size=4, pooling_kernel_size=2, mm_embed_dim=32, mm_posemb_size=16, output_proj_dims=32
        ),
        audio_config=dict(audio_embed_dim=32),
    )
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    shapes = mb.param_shapes_from_model(model)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=mb.DEFAULT_TARGETS, lora_dropout=0.0))
    frozen = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen, where, current = set(), collections.Counter(), ["outside"]
    for i, layer in enumerate(model.base_model.model.model.language_model.layers):
        if compiled:
            layer.forward = torch.compile(layer.forward)  # as train_ddp.add_lora: the hooks stay outside
        layer.register_forward_pre_hook(lambda *_, i=i: current.__setitem__(0, i))
        layer.register_forward_hook(lambda *_: current.__setitem__(0, "outside"))

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen | frozen:
            seen.add(storage.data_ptr())
            where[current[0]] += storage.nbytes()
        return t

    ids = torch.randint(20, 512, (2, 256))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
    measured = sum(v for k, v in where.items() if k != "outside")
    r = mb.estimate(
        shapes,
        cfg.text_config.to_dict(),
        mb.Layout(micro_batch=2),
        seq_len=256,
        lora_r=8,
        lora_dropout=0.0,
        attention="sdpa",  # sliding layers on transformers' masked SDPA, as here (the one global layer: within 2%)
        compiled=compiled,
    )
    predicted = sum(r["layer_saved_bytes"]) + 2 * r["lora_params"]  # + autocast's BF16 adapter copies
    assert predicted == pytest.approx(measured, rel=0.02), (predicted, measured)


# ---------------------------------------------------------------- CLI


def test_the_command_line_answers_a_usage_error_without_importing_torch():
    # torch (about 1.5 s) is imported only where a model is built or read, not to parse options and refuse them
    run = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "memory_budget.py"), "--gpus-per-node", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "--gpus-per-node" in run.stderr, run.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")]
    assert "torch" not in imported, [name for name in imported if "torch" in name][:5]


def test_cli_json(tiny_model_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "memory_budget.py"),
            str(tiny_model_path),
            "--json",
            "--gpus-per-node",
            "4",
            "--nodes",
            "2",
            "--tp",
            "2",
            "--micro-batch",
            "2",
            "--accum",
            "8",
            "--seq-len",
            "256",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    r = json.loads(out)
    assert r["global_batch"] == 64 and r["settings"]["world_size"] == 8
    assert r["peak_bytes"] > 0 and r["strategy"] == "DDP"


def test_cli_table(capsys):
    assert mb.main([str(CONFIG_12B), "--seq-len", "2048", "--micro-batch", "1", "--gpu-mem-gb", "48"]) == 0
    out = capsys.readouterr().out
    assert "65,634,304" in out and "fits" in out and "Strategy: DDP" in out
    # the trainer's default chunked loss, and SPEC's unchunked 6-9 GB beside it
    assert "logits + CE buffers unchunked (CE_CHUNK_TOKENS=0)            8.59 GB" in out
    assert "(chunks of 1024: 4.29 GB, 4.00 GiB)" in out


@pytest.mark.parametrize("attention", mb.ATTENTION_PATHS)
def test_the_reports_name_the_attention_path_they_assume(attention, capsys):
    """The kernel moves the peak by up to 10 GiB (12B, 8,192 tokens, no checkpointing): a saved report says which."""
    args = [str(CONFIG_12B), "--attention", attention]
    mb.main(args)
    assert f", {attention} attention, micro-batch 1 x 2048 tokens" in capsys.readouterr().out
    mb.main([*args, "--json"])
    assert json.loads(capsys.readouterr().out)["settings"]["attention"] == attention


def test_cli_defaults_are_the_trainers_and_the_verdict_speaks_gib(capsys):
    import train_ddp as T

    d, t = mb.parser().parse_args(["model"]), T.Config()
    assert (d.seq_len, d.micro_batch, d.accum, d.lora_r, d.lora_dropout, d.ce_chunk_tokens, d.targets) == (
        t.MAX_LEN,
        t.MICRO_BATCH,
        t.ACCUM_STEPS,
        t.LORA_R,
        t.LORA_DROPOUT,
        t.CE_CHUNK_TOKENS,
        t.LORA_TARGETS,
    )
    assert (d.ckpt_every, d.ckpt_offload) == (t.GRADIENT_CHECKPOINTING, t.CHECKPOINT_OFFLOAD) == (1, False)
    assert d.optimizer_offload == t.OPTIMIZER_OFFLOAD is False
    trainers = mb.layout_of(t)
    assert mb.layout_of(mb.run_of(d)) == mb.DEFAULT_LAYOUT == mb.Layout() == trainers
    mb.main([str(CONFIG_12B), "--gpu-mem-gb", "80"])
    strategy = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Strategy:"))
    assert "GiB of the 80.0 GiB card" in strategy and " GB" not in strategy


def cli_options(layout: mb.Layout, accum: int) -> list[str]:
    """The command-line options that describe `layout`, written out by hand."""
    return [
        "--micro-batch",
        str(layout.micro_batch),
        "--accum",
        str(accum),
        "--ckpt-every",
        str(layout.ckpt_every),
        *(["--ckpt-offload"] if layout.offload else []),
        *(["--optimizer-offload"] if layout.optimizer_offload else []),
        "--ce-chunk-tokens",
        str(layout.ce_chunk_tokens),
    ]


def test_cli_options_describe_every_layout_the_planner_can_choose():
    candidates = mb.candidate_layouts(8)
    assert len(candidates) == 5 * 4 * 3 * 2 and len(set(candidates)) == len(candidates)
    for layout in candidates:
        args = mb.parser().parse_args(["model", *cli_options(layout, 8 // layout.micro_batch)])
        assert mb.layout_of(mb.run_of(args)) == layout
    assert mb.parser().parse_args(["model", "--no-grad-ckpt"]).ckpt_every == 0


PLAN_TARGETS_GIB = (24.5, 25.5, 30, 40, 45, 50, 60, 130)


@pytest.mark.parametrize("target_gib", PLAN_TARGETS_GIB)
def test_cli_predicts_the_peak_of_each_planned_layout(capsys, shapes_12b, target_gib):
    """train_ddp.py's MEMORY_TARGET_GIB path (the planner) and the CLI with the plan's layout agree."""
    plan = mb.plan_for_memory_target(
        shapes_12b, mb.load_config(CONFIG_12B), target_gib, seq_len=2048, samples_per_step=8
    )
    assert plan["peak_bytes"] * (1 + mb.PREDICTION_MARGIN) <= target_gib * GiB
    layout = plan["layout"]
    assert plan["accum"] * layout.micro_batch == 8
    assert mb.main([str(CONFIG_12B), "--json", "--seq-len", "2048", *cli_options(layout, plan["accum"])]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["peak_bytes"] == plan["peak_bytes"] and r["global_batch"] == 8
    names = ("micro_batch", "ckpt_every", "offload", "ce_chunk_tokens", "optimizer_offload")
    assert {k: r["settings"][k] for k in names} == vars(layout)


def test_planner_choices_span_the_layouts(shapes_12b):
    """PLAN_TARGETS_GIB reach both offloads, checkpointing of every layer / 2nd / 4th / none, every micro-batch
    and loss chunk. AdamW's state goes to the host before the layer inputs do (two copies a step, not two a
    layer)."""
    plans = {
        t: mb.plan_for_memory_target(shapes_12b, mb.load_config(CONFIG_12B), t, seq_len=2048, samples_per_step=8)[
            "layout"
        ]
        for t in PLAN_TARGETS_GIB
    }
    assert {p.ckpt_every for p in plans.values()} == {0, 1, 2, 4}
    assert plans[24.5].offload and plans[24.5].optimizer_offload
    assert plans[25.5].optimizer_offload and not plans[25.5].offload and not plans[130].optimizer_offload
    assert {p.micro_batch for p in plans.values()} == {1, 2, 8}
    assert {p.ce_chunk_tokens for p in plans.values()} == {64, 256, 1024}
    with pytest.raises(ValueError, match="no layout fits 20 GiB .* more GPUs do not lower it: shorter rows"):
        mb.plan_for_memory_target(shapes_12b, mb.load_config(CONFIG_12B), 20, seq_len=2048, samples_per_step=8)


def test_compiled_layers_let_the_planner_take_a_larger_micro_batch(capsys, shapes_12b):
    """Compiled layers keep less (123.4 GiB measured at micro-batch 4 on the H200, 123.3 predicted compiled,
    152.5 eager): for MEMORY_TARGET_GIB=130, COMPILE_LAYERS=1 plans micro-batch 4 where eager plans 2."""
    import train_ddp as T

    run = T.Config(MODEL_CONFIG=str(CONFIG_12B), MEMORY_TARGET_GIB=130, ATTENTION_KERNEL="ffpa", MICRO_BATCH=1)
    eager, compiled = (mb.plan_run(dataclasses.replace(run, COMPILE_LAYERS=c), 1)[0] for c in (False, True))
    assert (eager["MICRO_BATCH"], compiled["MICRO_BATCH"]) == (2, 4) and compiled["ACCUM_STEPS"] == 2
    layout = ["--micro-batch", "4", "--accum", "2", "--ckpt-every", "0", "--ce-chunk-tokens", "1024"]
    mb.main([str(CONFIG_12B), *layout, "--compile-layers"])  # the command line says the same
    assert "layers compiled" in capsys.readouterr().out
    assert mb.main([str(CONFIG_12B), *layout, "--compile-layers", "--json"]) == 0
    assert (
        json.loads(capsys.readouterr().out)["peak_bytes"]
        <= 127 * GiB
        < mb.estimate(shapes_12b, mb.load_config(CONFIG_12B), mb.Layout(4, 0, False, 1024), seq_len=2048, accum=2)[
            "peak_bytes"
        ]
    )


@pytest.mark.parametrize(("target", "compile_layers", "peak_gib"), [(75, True, 72.7), (44, False, 42.5)])
def test_cli_runs_the_trainers_planner_and_reproduces_the_readmes_predicted_rows(
    target, compile_layers, peak_gib, capsys
):
    """--memory-target-gib prints, reports and puts in --json what train_ddp.py's MEMORY_TARGET_GIB chooses for
    README's rows (12B, 2,048 tokens, 8 samples per GPU per step, 8 GPUs, ffpa)."""
    run = T.Config(
        MODEL_ID=str(CONFIG_12B),
        MEMORY_TARGET_GIB=float(target),
        COMPILE_LAYERS=compile_layers,
        ATTENTION_KERNEL="ffpa",
    )
    chosen, line = mb.plan_run(run, 8)
    assert f"predicted peak {peak_gib} GiB" in line  # the trainer's planner gives README's figure
    argv = [str(CONFIG_12B), "--gpus-per-node", "8", "--memory-target-gib", str(target)]
    argv += ["--compile-layers"] if compile_layers else []
    assert mb.main(argv) == 0
    out = capsys.readouterr().out
    assert f"planner: {line} with {' '.join(f'{k}={v}' for k, v in chosen.items())}\n" in out
    assert f"micro-batch {chosen['MICRO_BATCH']} x 2048 tokens" in out  # the report is of the chosen layout
    assert mb.main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (
        r["plan"] == {"MEMORY_TARGET_GIB": target, **chosen, "replaced_options": []}
        and round(r["peak_bytes"] / GiB, 1) == peak_gib
    )
    readme = (ROOT / "README.md").read_text()
    assert f"`MEMORY_TARGET_GIB={target}{' COMPILE_LAYERS=1' if compile_layers else ''}` | {peak_gib} GiB |" in readme
    assert (
        "Predicted rows: `python memory_budget.py configs/gemma-4-12b.json --memory-target-gib 75 --compile-" in readme
    )


def test_cli_says_which_of_its_options_the_planner_replaced(capsys):
    argv = [str(CONFIG_12B), "--memory-target-gib", "75", "--compile-layers", "--ckpt-every", "2", "--ckpt-offload"]
    assert mb.main(argv) == 0
    planner = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("planner:"))
    assert "GRADIENT_CHECKPOINTING=0 CHECKPOINT_OFFLOAD=False" in planner  # 75 GiB needs neither, on the 12B
    assert planner.endswith(" (replacing --ckpt-every 2, --ckpt-offload)"), planner
    assert mb.main([*argv, "--micro-batch", "2", "--accum", "4", "--json"]) == 0  # kept: the planner keeps 2 x 4
    assert json.loads(capsys.readouterr().out)["plan"]["replaced_options"] == ["--ckpt-every 2", "--ckpt-offload"]


def test_huge_figures_keep_their_columns_apart(capsys):
    assert mb.main([str(CONFIG_12B), "--gpus-per-node", "1000", "--seq-len", "10000000"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.endswith(" GiB") and " GB" in line]
    assert rows and all(re.fullmatch(r"  .+ +[\d.]+ GB +[\d.]+ GiB", row) for row in rows), rows


def test_cli_planner_refusals_are_one_line(capsys):
    """A target no layout fits, and options train_ddp.py has not, are usage errors naming the option."""
    err = usage_error(mb.main, [str(CONFIG_12B), "--memory-target-gib", "20"], capsys)
    assert "error: --memory-target-gib 20: no layout fits 20.0 GiB per GPU" in err.splitlines()[-1], err
    for other in (["--tp", "2", "--gpus-per-node", "2"], ["--full"], ["--train-embeddings"]):
        err = usage_error(mb.main, [str(CONFIG_12B), "--memory-target-gib", "75", *other], capsys)
        assert "error: --memory-target-gib plans train_ddp.py's runs, which have no --tp, --full" in err, err


def test_a_memory_target_beyond_the_card_names_the_card_option(capsys):
    """--memory-target-gib 130 (README's H200 row) was planned, then judged on the default 80 GiB card: "DOES NOT
    FIT" and a TP/PP strategy, for the layout README measured fitting on an H200."""
    err = usage_error(mb.main, [str(CONFIG_12B), "--memory-target-gib", "130", "--compile-layers"], capsys)
    assert err.splitlines()[-1].endswith(
        "error: --memory-target-gib 130 is more than the card's memory, --gpu-mem-gb 80 (its default): give your "
        "card's, e.g. --gpu-mem-gb 141 for an H200"
    ), err
    assert mb.main([str(CONFIG_12B), "--memory-target-gib", "130", "--compile-layers", "--gpu-mem-gb", "141"]) == 0
    assert "of 141 GiB: fits" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus-per-node", "0"], "argument --gpus-per-node: must be an integer >= 1 (got 0)"),
        (["--nodes", "-1"], "argument --nodes: must be an integer >= 1 (got -1)"),
        (["--seq-len", "-5"], "argument --seq-len: must be an integer >= 1 (got -5)"),
        (["--seq-len", "0"], "argument --seq-len: must be an integer >= 1 (got 0)"),
        (["--accum", "0"], "argument --accum: must be an integer >= 1 (got 0)"),
        (["--micro-batch", "0"], "argument --micro-batch: must be an integer >= 1 (got 0)"),
        (["--ckpt-every", "-1"], "argument --ckpt-every: must be an integer >= 0 (got -1)"),
        (["--ce-chunk-tokens", "-64"], "argument --ce-chunk-tokens: must be an integer >= 0 (got -64)"),
        (["--lora-r", "0"], "argument --lora-r: must be an integer >= 1 (got 0)"),
        (["--lora-dropout", "2"], "argument --lora-dropout: must be a number >= 0 and < 1 (got 2)"),
        (["--gpu-mem-gb", "-3"], "argument --gpu-mem-gb: must be a number > 0 (got -3)"),
        (["--bus-bw-gbps", "0"], "argument --bus-bw-gbps: must be a number > 0 (got 0)"),
        (["--tp", "3"], "--tp 3 does not divide the world size 1"),
        (["--targets", "("], "argument --targets: '(' is not a regular expression"),
        (["--targets", "nomatch"], "LoRA targets 'nomatch' match no Linear module"),  # on the tiny model's headers
        (["nosuchfile.json"], "argument model: nosuchfile.json: no such file or folder"),
    ],
)
def test_cli_refuses_bad_values_in_one_line_before_building_a_model(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(mb, "_shapes_from_config", lambda *a: pytest.fail("built a model for a bad command line"))
    model = [] if argv[0] == "nosuchfile.json" else [str(ROOT / "assets" / "tiny-gemma4")]
    err = usage_error(mb.main, [*model, *argv], capsys)
    assert f"error: {message}" in err, err


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("llama.json", {"model_type": "llama"}, "{} says model_type 'llama': memory_budget.py models Gemma 4 (gemma4"),
        ("no_heads.json", {"model_type": "gemma4_unified"}, "{} has no num_attention_heads, num_key_value_heads"),
        ("no_config", None, "argument model: {}: no config.json in this folder"),  # a folder
        ("", None, "argument model: empty: give a model folder, a config.json or a hub id"),
    ],
)
def test_cli_says_in_one_line_which_model_it_cannot_budget(name, config, message, tmp_path, capsys, monkeypatch):
    """Another architecture, a config.json without the text fields read, a folder without config.json, an empty
    argument: each named before a model is built."""
    monkeypatch.setattr(mb, "_shapes_from_config", lambda *a: pytest.fail("built a model for a bad model argument"))
    model = str(tmp_path / name) if name else ""
    if config:
        Path(model).write_text(json.dumps(config))
    elif name:
        Path(model).mkdir()
    err = usage_error(mb.main, [model], capsys)
    assert f"error: {message.format(model)}" in err.splitlines()[-1], err  # one line, after the usage


def test_a_text_only_layout_is_pointed_to_targets_that_match_it(tmp_path, tiny_model_path, capsys):
    """gemma4_text names its modules without language_model: the default targets match none, TEXT_ONLY_TARGETS
    match the same adapters as the default ones in the unified model."""
    text_only = tmp_path / "config.json"
    text = json.loads((tiny_model_path / "config.json").read_text())["text_config"]
    text_only.write_text(json.dumps(text | {"model_type": "gemma4_text"}))
    err = usage_error(mb.main, [str(text_only)], capsys)
    assert f"match no Linear module; in a text-only layout try --targets '{mb.TEXT_ONLY_TARGETS}'" in err, err
    counts = []
    for argv in ([str(text_only), "--targets", mb.TEXT_ONLY_TARGETS], [str(tiny_model_path)]):
        assert mb.main([*argv, "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        counts.append((r["lora_modules"], r["lora_params"]))
    assert counts[0] == counts[1] and counts[0][0] > 0


@pytest.mark.parametrize(
    ("argv", "warning"),
    [  # the tiny model: hidden size 64, max_position_embeddings 4096
        (["--lora-r", "65"], "--lora-r 65 is above the hidden size 64: no adapted matrix has that rank"),
        (["--seq-len", "4097"], "--seq-len 4097 is beyond the model's max_position_embeddings 4096"),
        (
            ["--nodes", "2"],
            "--bus-bw-gbps 100 is taken across 2 nodes too: inter-node links are usually slower, give theirs",
        ),
        (["--lora-r", "64", "--seq-len", "4096", "--nodes", "2", "--bus-bw-gbps", "25"], None),
    ],
)
def test_cli_warns_of_values_a_run_would_not_want(argv, warning, tiny_model_path, capsys):
    assert mb.main([str(tiny_model_path), *argv]) == 0
    err = capsys.readouterr().err
    assert err == (f"warning: {warning}\n" if warning else ""), err


def test_a_tp_report_speaks_of_each_gpus_share(capsys):
    mb.main([str(CONFIG_12B), "--gpus-per-node", "8", "--tp", "2"])
    assert "Strategy: DDP: one GPU's 1/2 of a replica (TP 2) needs " in capsys.readouterr().out


def test_param_shapes_of_a_peft_model_are_those_of_its_base(tiny_model_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    before = mb.param_shapes_from_model(AutoModelForCausalLM.from_pretrained(tiny_model_path))
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_path), LoraConfig(r=4, target_modules=mb.DEFAULT_TARGETS)
    )
    assert mb.param_shapes_from_model(peft_model.get_base_model()) == before


def test_the_fast_kernels_drop_the_mask_bias_and_the_repeated_kv(shapes_12b, text_12b):
    """8 global layers of 16 query and 2 KV heads of 512: SDPA is_causal saves the 2-byte mask bias per
    (token, key); ffpa also the BF16 copy of K and V repeated from 2 to 16 heads, and in the 40 sliding layers
    (8 KV heads of 256, window 1,024 < 2,048 tokens) FlashAttention-2's window both, and the boolean mask."""
    peak = {
        a: budget(shapes_12b, text_12b, ckpt_every=0, attention=a)["peak_bytes"] for a in ("masked", "sdpa", "ffpa")
    }
    tokens, global_layers, sliding_layers = 2048, 8, 40
    boolean_mask = tokens**2  # one per layer type that takes one, kept to the end of backward
    assert peak["masked"] - peak["sdpa"] == global_layers * tokens * 2 * 2048 + boolean_mask
    global_repeat = global_layers * tokens * 2 * 2 * (16 - 2) * 512
    sliding = sliding_layers * tokens * (2 * 2048 + 2 * 2 * (16 - 8) * 256) + boolean_mask
    assert peak["sdpa"] - peak["ffpa"] == global_repeat + sliding


def test_a_hub_id_that_cannot_be_reached_is_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # offline, nothing cached
    run = subprocess.run(
        [sys.executable, str(ROOT / "memory_budget.py"), "google/gemma-4-12B-it"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith("error: google/gemma-4-12B-it: ") and len(run.stderr.splitlines()) == 1


def test_packed_rows_are_planned_on_flex_in_every_layer(shapes_12b, text_12b):
    """PACKING=1 plans "flex": no dense mask even in the sliding layers (window 1,024 < 2,048 tokens) and K/V
    never repeated (40 sliding layers of 8 KV heads of 256, 8 global layers of 2 KV heads of 512, 16 query heads)."""
    import train_ddp as T

    config = mb.load_config(CONFIG_12B)
    packed = T.Config(ATTENTION_KERNEL="ffpa", PACKING=True, GRADIENT_CHECKPOINTING=0)
    expected = mb.estimate(shapes_12b, config, mb.layout_of(packed), seq_len=2048, accum=8, attention="flex")
    assert mb.estimate_run(packed, shapes_12b, config, 1)["peak_bytes"] == expected["peak_bytes"]
    # the same as ffpa on right-padded rows (sliding layers on FlashAttention-2's window), less than SDPA's masks
    ffpa = budget(shapes_12b, text_12b, ckpt_every=0, attention="ffpa")["peak_bytes"]
    flex = budget(shapes_12b, text_12b, ckpt_every=0, attention="flex")["peak_bytes"]
    assert flex == ffpa < budget(shapes_12b, text_12b, ckpt_every=0, attention="sdpa")["peak_bytes"]


def test_a_checkpointed_layer_keeps_the_mask_its_recompute_takes(shapes_12b, text_12b):
    """ffpa's layers take no mask, yet transformers builds Gemma4Unified's boolean one per layer type (sliding and
    global): unsaved without checkpointing, each is an input of the checkpointed layers' recompute, so it lives to
    the end of backward (micro_batch x 2,048^2 bytes each). Packed rows (flex) get block masks: nothing that size."""

    def peak(attention, ckpt_every):
        return budget(shapes_12b, text_12b, micro_batch=2, ckpt_every=ckpt_every, attention=attention)["peak_bytes"]

    assert peak("ffpa", 0) == peak("flex", 0)
    assert peak("ffpa", 1) - peak("flex", 1) == 2 * 2 * 2048**2  # 2 layer types, micro-batch 2
