"""What one 12B decoder layer keeps for backward, eager against COMPILE_LAYERS, and the loss chunk's peak.

    python3 bench_results/issue24/saved_bytes.py [TOKENS]     (GPU; about a minute)

Builds configs/gemma-4-12b.json cut to its first 6 layers (5 sliding, 1 global) with train_ddp.py's own
load_model/add_lora (LoRA r=16 on q/k/v/o/gate/up/down, dropout 0.05, ffpa on the global layer), runs one
micro-batch of TOKENS right-padded tokens under BF16 autocast and counts, per layer, the distinct storages
autograd saves other than the weights (saved_tensors_hooks: eager ops and the compiled layer's graph alike).
Then the extra peak of the loss over TOKENS-1 targets at the 12B vocabulary: checkpointed chunks (eager)
against LinearCrossEntropy.
Prints KB per token per layer, the saved tensors of the compiled sliding layer, and the loss peaks in GiB.
"""

import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.chdir(REPO)
import train_ddp  # noqa: E402
from lm_loss import CausalLMLoss, LinearCrossEntropy  # noqa: E402

TOKENS = int(sys.argv[1]) if __name__ == "__main__" and len(sys.argv) > 1 else 2048
device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")  # CPU: a smoke test


def cut_config(n_layers: int) -> str:
    config = json.loads((REPO / "configs" / "gemma-4-12b.json").read_text())
    text = config["text_config"]
    text["num_hidden_layers"], text["layer_types"] = n_layers, text["layer_types"][:n_layers]
    text["per_layer_config"] = {k: v for k, v in text["per_layer_config"].items() if int(k) < n_layers}
    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


class Tagged(torch.nn.Module):
    """A decoder layer that says which layer is running (outside any compiled region)."""

    def __init__(self, layer, index, state):
        super().__init__()
        self.layer, self.index, self.state = layer, index, state

    def forward(self, *args, **kwargs):
        self.state["layer"] = self.index
        out = self.layer(*args, **kwargs)
        self.state["layer"] = None
        return out


def saved_per_layer(compiled: bool) -> tuple[dict, dict]:
    cfg = train_ddp.Config(
        MODEL_CONFIG=cut_config(6), GRADIENT_CHECKPOINTING=0, COMPILE_LAYERS=compiled, ATTENTION_KERNEL="auto"
    )
    model = train_ddp.add_lora(train_ddp.load_model(cfg, device), cfg)
    decoder = model.get_base_model().get_decoder()
    state, seen, shapes = {"layer": None}, {}, {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}  # saved, but not activations
    for i, layer in enumerate(decoder.layers):
        decoder.layers[i] = Tagged(layer, i, state)

    def pack(t):
        i = state["layer"]
        storage = t.untyped_storage()
        if i is not None and storage.data_ptr() not in weights:
            seen.setdefault(i, {})[storage.data_ptr()] = storage.nbytes()
            shapes.setdefault(i, []).append((tuple(t.shape), str(t.dtype).replace("torch.", "")))
        return t

    loss_module = CausalLMLoss(model, 1024, compiled=compiled)
    ids = torch.randint(10, 1000, (1, TOKENS), device=device)
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids, right_padded=True)
    for _ in range(2):  # the first compiles
        seen.clear()
        shapes.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), train_ddp.autocast(device):
            loss, _ = loss_module(**batch)
        loss.backward()
    per_token = {i: sum(s.values()) / TOKENS / 1024 for i, s in seen.items()}
    return per_token, shapes


def loss_peak(fused: bool, chunk: int) -> float:
    weight = torch.randn(262144, 3840, device=device, dtype=torch.bfloat16) * 0.02
    hidden = torch.randn(TOKENS - 1, 3840, device=device, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 262144, (TOKENS - 1,), device=device)
    eager_loss = CausalLMLoss.logits_loss_sum  # a method of lm_head and softcap only
    head = SimpleNamespace(lm_head=lambda h: torch.nn.functional.linear(h, weight), softcap=30.0)

    def run():
        with train_ddp.autocast(device):
            if fused:
                loss = LinearCrossEntropy.apply(hidden, weight, targets, 30.0, chunk)
            else:
                loss = sum(
                    torch.utils.checkpoint.checkpoint(
                        eager_loss, head, hidden[i : i + chunk], targets[i : i + chunk], use_reentrant=False
                    )
                    for i in range(0, len(targets), chunk)
                )
        loss.backward()
        hidden.grad = None

    run()  # compile, warm
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def main() -> None:
    eager, _ = saved_per_layer(False)
    compiled, shapes = saved_per_layer(True)
    print(f"\nKB saved per token per layer, {TOKENS} tokens, micro-batch 1 (layer 5 is the global one)")
    print("| layer | eager | compiled | compiled / eager |\n|---|---|---|---|")
    for i in sorted(eager):
        print(f"| {i} | {eager[i]:.1f} | {compiled.get(i, 0):.1f} | {compiled.get(i, 0) / eager[i]:.3f} |")
    print("\ncompiled layer 0 (sliding) saves:", shapes.get(0))
    print("compiled layer 5 (global) saves:", shapes.get(5))
    if device.type == "cpu":
        sys.exit(0)
    print(f"\nloss over {TOKENS - 1} targets, vocab 262,144: extra peak allocated GiB (forward + backward)")
    print("| chunk | checkpointed chunks (eager) | LinearCrossEntropy (compiled) |\n|---|---|---|")
    for chunk in (256, 1024):
        print(f"| {chunk} | {loss_peak(False, chunk):.3f} | {loss_peak(True, chunk):.3f} |")


if __name__ == "__main__":
    main()
