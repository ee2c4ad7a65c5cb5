"""Why a compiled, checkpointed 12B layer saved 75 tensors in its forward and 74 in its recompute on the H200
(calls 5 and 6: torch.utils.checkpoint.CheckpointError) where the CPU tests passed. The variant under test is
commit 8c2d626's train_ddp.add_lora (reverted since): non-reentrant checkpointing AROUND each compiled decoder
layer, the layer input offloaded by hooks that keep its requires_grad. One forward and backward of the 12B cut to
6 layers (5 sliding, 1 global) under checkpoint debug mode per setting; prints each outcome and the head and tail
of the error (the ops each pass saved).

    python3 bench_results/issue24/checkpoint_debug.py [LAYERS] [plain]   (default 6 layers; 48: the whole 12B;
                                                                           plain: without checkpoint debug mode)
"""

import dataclasses
import functools
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
from saved_bytes import cut_config
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import train_ddp  # noqa: E402
from lm_loss import CausalLMLoss  # noqa: E402


def to_host(tensor):
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return tensor.device, host.copy_(tensor.detach(), non_blocking=True), tensor.requires_grad


def from_host(saved):
    device, host, requires_grad = saved
    return host.to(device, non_blocking=True).requires_grad_(requires_grad)


def checkpointed(forward, offload, *args, **kwargs):
    with torch.autograd.graph.saved_tensors_hooks(to_host, from_host) if offload else nullcontext():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)


SHARING_LAYERS_EAGER = os.environ.get("SHARING_LAYERS_EAGER", "1") == "1"


def around_compiled_layers(model, cfg) -> None:
    """The variant: each decoder layer compiled (COMPILE_LAYERS), then checkpointed around (every
    GRADIENT_CHECKPOINTING-th), its input offloaded with CHECKPOINT_OFFLOAD. With SHARING_LAYERS_EAGER, the
    layers that write or read shared_kv_states (the last of each type writes, even in the 12B) stay eager: the
    dict is empty or half full in the forward and full in the recompute, each a guard of its own, and with
    the padded widths the 8 recompiles torch allows per code object run out (then layers run eagerly)."""
    for i, layer in enumerate(model.get_base_model().get_decoder().layers):
        attention = layer.self_attn
        sharing = SHARING_LAYERS_EAGER and (attention.store_full_length_kv or attention.is_kv_shared_layer)
        forward = torch.compile(layer.forward) if cfg.COMPILE_LAYERS and not sharing else layer.forward
        if cfg.GRADIENT_CHECKPOINTING and i % cfg.GRADIENT_CHECKPOINTING == 0:
            forward = functools.partial(checkpointed, forward, cfg.CHECKPOINT_OFFLOAD)
        layer.forward = forward


def main() -> None:
    device = torch.device("cuda", 0)
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 6  # plain: is checkpoint debug mode what hides the error?
    for compiled, offload, kernel in ((False, True, "ffpa"), (True, True, "ffpa"), (True, False, "sdpa")):
        torch._dynamo.reset()
        cfg = train_ddp.Config(MODEL_CONFIG=cut_config(layers), GRADIENT_CHECKPOINTING=0, ATTENTION_KERNEL=kernel)
        model = train_ddp.add_lora(train_ddp.load_model(cfg, device), cfg)
        around_compiled_layers(
            model,
            dataclasses.replace(cfg, COMPILE_LAYERS=compiled, GRADIENT_CHECKPOINTING=1, CHECKPOINT_OFFLOAD=offload),
        )
        loss_module = CausalLMLoss(model, 256, compiled=True)
        ids = torch.randint(10, 1000, (1, 2048), device=device)
        what = f"{layers} layers, compiled={compiled} offload={offload} kernel={kernel}"
        try:
            with torch.utils.checkpoint.set_checkpoint_debug_enabled("plain" not in sys.argv):
                for _ in range(2):
                    with train_ddp.autocast(device):
                        loss, _ = loss_module(ids, torch.ones_like(ids), ids, right_padded=True)
                    loss.backward()
            print(f"== {what}: ok", flush=True)
        except Exception as e:
            text = str(e)
            print(f"== {what}: {type(e).__name__}\n{text[:5000]}\n...\n{text[-2500:]}", flush=True)
        del model, loss_module
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
