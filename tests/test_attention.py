"""attention.py: the global layers' mask-free causal kernels compute what transformers' masked SDPA does,
on right-padded batches only. CPU: the sdpa route in FP32, exactly. GPU (python -m pytest -m gpu):
ffpa and SDPA is_causal on a 12B-shaped layer pair in BF16, as close to an FP32 reference as SDPA's BF16 path."""

import copy
import json

import pytest
import torch
from conftest import ROOT, SAMPLE_DATA, nonzero_lora_b

import attention
import chat_data
import train_ddp as T
from collate import IGNORE_INDEX, PadCollate
from lm_loss import CausalLMLoss


def right_padded_batch(tokenizer, lengths):
    """Rows of the sample data cut to `lengths` tokens, right-padded by the trainer's collate."""
    rows = [
        chat_data.tokenize_conversation(tokenizer, r, 2048, True)
        for r in chat_data.load_conversations(str(SAMPLE_DATA))
    ]
    rows = sorted(rows, key=lambda r: -len(r["input_ids"]))[: len(lengths)]
    return PadCollate(tokenizer.pad_token_id, 1)(
        [{k: v[:n] for k, v in r.items()} for r, n in zip(rows, lengths, strict=True)]
    )


def left_padded(batch):
    """The same rows padded on the left: the padding now precedes real tokens."""
    order = torch.argsort(batch["attention_mask"], dim=1, stable=True)  # zeros (padding) first
    return {k: torch.gather(v, 1, order) for k, v in batch.items()}


def with_lora(model):
    """LoRA (no dropout) on the text decoder's projections, B non-zero so that every adapter gets a gradient."""
    from peft import LoraConfig, get_peft_model

    return nonzero_lora_b(
        get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=T.Config.LORA_TARGETS))
    )


def loss_and_grads(model, batch, right_padded):
    model.zero_grad(set_to_none=True)
    loss, _ = CausalLMLoss(model, T.Config.CE_CHUNK_TOKENS)(**batch, right_padded=right_padded)
    loss.backward()
    return loss.detach(), [p.grad.clone() for _, p in sorted(model.named_parameters()) if p.grad is not None]


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    from transformers import AutoModelForCausalLM

    return with_lora(
        AutoModelForCausalLM.from_pretrained(
            str(ROOT / "assets" / "tiny-gemma4"), attn_implementation=attention.register("sdpa")
        )
    ).train()


@pytest.fixture
def global_layer_masks(monkeypatch):
    """For each global-layer call: whether SDPA got a mask (None when the causal route was taken)."""
    seen = []
    real = attention.sdpa_attention_forward

    def spy(module, q, k, v, mask, sliding_window=None, **kwargs):
        if sliding_window is None:
            seen.append(mask is not None)
        return real(module, q, k, v, mask, sliding_window=sliding_window, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", spy)
    return seen


def test_right_padded_rows_get_the_masked_loss_and_lora_gradients_without_the_mask(
    tokenizer, tiny_model, global_layer_masks
):
    batch = right_padded_batch(tokenizer, [300, 170, 60])  # longer than the sliding window (128), and padded
    assert T.on_device(batch, torch.device("cpu"))["right_padded"]
    masked = loss_and_grads(tiny_model, batch, right_padded=False)
    assert global_layer_masks == [True] and global_layer_masks.clear() is None
    causal = loss_and_grads(tiny_model, batch, right_padded=True)
    assert global_layer_masks == [False]  # the global layer really ran without a mask
    torch.testing.assert_close(causal[0], masked[0], rtol=1e-6, atol=0)
    assert len(causal[1]) == len(masked[1]) == 2 * (7 * 6 - 1)  # A, B of 7 projections x 6 layers; k_eq_v: no v_proj
    for a, b in zip(causal[1], masked[1], strict=True):  # FP32: only the summation order differs
        assert float((a - b).norm()) <= 1e-5 * float(b.norm())


def test_no_query_of_a_right_padded_batch_is_left_without_keys(tokenizer, tiny_model, monkeypatch):
    """Padding past a short row's end by more than the sliding window (128) must still see a key (itself): with
    keyless query rows the real job's GPU steps had NaN gradients (test_train_ddp's
    test_short_rows_beside_long_ones_give_finite_gradients_on_gpu)."""
    keyless = []
    real = attention.sdpa_attention_forward

    def spy(module, q, k, v, mask, **kwargs):
        if mask is not None:
            keyless.append(int((~mask.bool().any(-1)).sum()))
        return real(module, q, k, v, mask, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", spy)
    batch = right_padded_batch(tokenizer, [300, 170, 60])  # the 60-token row: 240 padding positions
    loss_and_grads(tiny_model, batch, right_padded=True)
    assert keyless and not any(keyless)


CASES = {  # attention()'s keywords; sliding_flash is register()'s choice for ffpa on an Ampere-or-newer GPU
    "sliding layer, bf16": {"sliding_window": 4, "right_padded": True, "dtype": torch.bfloat16},
    "sliding layer, sdpa or pre-Ampere": {
        "sliding_window": 4, "right_padded": True, "dtype": torch.bfloat16, "sliding_flash": False
    },
    "sliding layer, FP32": {"sliding_window": 4, "right_padded": True, "dtype": torch.float32},
    "attention dropout": {"dropout": 0.1, "right_padded": True},
    "not right-padded": {"right_padded": False},
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_only_a_causal_dropout_free_layer_of_a_right_padded_batch_drops_its_mask(monkeypatch, case):
    """A global one (ffpa, not importable here, or SDPA is_causal), or with ffpa a sliding one in BF16 or FP16 on
    FlashAttention-2's window. Everything else keeps transformers' masked SDPA."""
    calls = []
    monkeypatch.setattr(attention, "sdpa_attention_forward", lambda *a, **k: calls.append(a[4]) or (None, None))
    monkeypatch.setattr(attention.SlidingWindowFlash, "apply", lambda *a: calls.append(("window", a[3])) or None)
    kwargs = {"kernel": "ffpa", "sliding_flash": True, "dtype": torch.float32, **CASES[case]}
    q = torch.zeros(1, 4, 8, 16, dtype=kwargs.pop("dtype"))
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    attention.attention(torch.nn.Module(), q, q, q, mask, **kwargs)
    assert calls == ([("window", 4)] if case == "sliding layer, bf16" else [mask])


def test_left_padded_rows_keep_the_mask_which_they_need(tokenizer, tiny_model, global_layer_masks):
    batch = left_padded(right_padded_batch(tokenizer, [300, 170, 60]))
    inputs = T.on_device(batch, torch.device("cpu"))
    assert not inputs.pop("right_padded")
    reference = loss_and_grads(tiny_model, inputs, right_padded=False)
    assert global_layer_masks == [True]
    wrong = loss_and_grads(tiny_model, inputs, right_padded=True)  # what a missing check would do
    worst = max(float((a - b).norm() / b.norm()) for a, b in zip(wrong[1], reference[1], strict=True))
    assert worst > 1e-3  # real tokens attended to the padding before them (100x the tolerance above)


@pytest.mark.parametrize(
    "kernel,device,message", [("ffpa", "cpu", "needs a CUDA device"), ("flex", "cpu", "unknown kernel")]
)
def test_a_kernel_this_machine_cannot_run_is_refused(kernel, device, message):
    with pytest.raises(ValueError, match=message):
        attention.choose(kernel, torch.device(device))


def test_auto_says_which_kernel_and_why():
    kernel, line = attention.choose("auto", torch.device("cpu"))
    assert kernel == "sdpa" and "global layers on SDPA is_causal" in line and "no CUDA device" in line


# ---------------------------------------------------------------- GPU: the real kernels at the 12B's shapes
def gemma4_12b_layer_pair():
    """The 12B's text config cut to one sliding and one global layer (head_dim 512, 2 KV heads)."""
    config = json.loads((ROOT / "configs" / "gemma-4-12b.json").read_text())
    text = config["text_config"]
    text.update(
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        per_layer_config={"1": text["per_layer_config"]["05"]},
        sliding_window=512,
    )
    return config


def relative_errors(got, reference):
    loss, grads = got
    ref_loss, ref_grads = reference
    diff = torch.cat([(g.float() - r.float()).flatten() for g, r in zip(grads, ref_grads, strict=True)])
    reference_norm = torch.cat([r.float().flatten() for r in ref_grads]).norm()
    return abs(float(loss - ref_loss) / float(ref_loss)), float(diff.norm() / reference_norm)


def models_at_12b_shapes(kernel: str):
    """(config, BF16 model with LoRA on CUDA, its FP32 copy) of gemma4_12b_layer_pair()."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**gemma4_12b_layer_pair())
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation=attention.register(kernel)
        )
    model = with_lora(base)
    return config, model, copy.deepcopy(model).float()


def assert_as_close_as_sdpa_bf16(name, models, reference_inputs, inputs, right_padded):
    """`inputs` through the BF16 model are as close to the FP32 masked-SDPA reference (on `reference_inputs`, the
    same tokens) as SDPA's own BF16 path is: loss and LoRA-gradient relative errors within 2x, plus 1e-3."""
    _, model, reference_model = models
    reference = loss_and_grads(reference_model, reference_inputs, right_padded=False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        sdpa_bf16 = loss_and_grads(model, reference_inputs, right_padded=False)
        fast_bf16 = loss_and_grads(model, inputs, right_padded=right_padded)
    sdpa_err, fast_err = relative_errors(sdpa_bf16, reference), relative_errors(fast_bf16, reference)
    print(f"{name}: loss and LoRA-gradient relative errors vs FP32 {fast_err}, SDPA BF16 {sdpa_err}")
    assert fast_err[0] <= 2 * sdpa_err[0] + 1e-3 and fast_err[1] <= 2 * sdpa_err[1] + 1e-3


def random_right_padded(config, lengths):
    """Random tokens in rows of `lengths`, right-padded to the longest, on CUDA (every real token a target)."""
    width = max(lengths)
    ids = torch.randint(
        10, config.get_text_config().vocab_size, (len(lengths), width), generator=torch.Generator().manual_seed(1)
    )
    mask = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
    batch = {"input_ids": ids * mask, "attention_mask": mask, "labels": torch.where(mask.bool(), ids, IGNORE_INDEX)}
    inputs = T.on_device(batch, torch.device("cuda"))
    assert inputs.pop("right_padded")
    return inputs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kernel", ["ffpa", "sdpa"])
def test_global_layer_kernel_matches_sdpa_at_12b_shapes_with_right_padded_rows(kernel):
    if kernel == "ffpa":
        pytest.importorskip("ffpa_attn")
    models = models_at_12b_shapes(kernel)
    inputs = random_right_padded(models[0], [1536, 1100])
    assert_as_close_as_sdpa_bf16(kernel, models, inputs, inputs, right_padded=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_rows_match_the_unpacked_rows_at_12b_shapes():
    """Packed rows on flex_attention (attention.packed_masks' block masks), BF16, against the same conversations
    unpacked in FP32; one conversation is longer than the window, so a window ignored inside it or one that
    reaches into the conversation before shows up in the gradients."""
    import packing

    models = models_at_12b_shapes("sdpa")
    generator = torch.Generator().manual_seed(2)
    conversations = []
    for n in (300, 1100, 400, 200):  # 1,100 > the window (512), after a conversation of 300
        ids = torch.randint(10, models[0].get_text_config().vocab_size, (n,), generator=generator).tolist()
        conversations.append({"input_ids": ids, "labels": ids})
    unpacked = T.on_device(PadCollate(0, 1)(conversations), torch.device("cuda"))
    packed = T.on_device(packing.PackCollate(0, 2048)([conversations]), torch.device("cuda"))
    unpacked.pop("right_padded"), packed.pop("right_padded")
    assert_as_close_as_sdpa_bf16("packed flex", models, unpacked, packed, right_padded=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_sliding_layers_on_flash_windows_match_sdpa_at_12b_shapes(compiled):
    """With ffpa, the sliding layer of right-padded rows runs FlashAttention-2's native window (its forward and
    backward kernels seen by the profiler): as close to the FP32 masked reference as SDPA's BF16 path, beside a
    short row whose padding runs past the window (512 here). Compiled as COMPILE_LAYERS compiles it, inside the
    layer's graph (no graph break)."""
    pytest.importorskip("ffpa_attn")
    models = models_at_12b_shapes("ffpa")
    sliding = models[1].get_base_model().get_decoder().layers[0]
    if compiled:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        sliding.forward = torch.compile(sliding.forward)
    inputs = random_right_padded(models[0], [1536, 300])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        assert_as_close_as_sdpa_bf16(
            f"flash window, {'compiled' if compiled else 'eager'}", models, inputs, inputs, True
        )
    ran = {e.name for e in profile.events()}
    assert {"aten::_flash_attention_forward", "aten::_flash_attention_backward"} <= ran
    if compiled:
        assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
