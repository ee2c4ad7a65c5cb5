"""The causal-LM loss, inside the module DDP wraps (so DDP's forward prepares the gradient reduction).

CausalLMLoss returns the loss SUM and the number of targets of a micro-batch: train_ddp.forward_backward
weights them into the global token-mean loss. With chunking, only target positions reach the LM head; under
COMPILE_LAYERS each chunk's gradient is computed in the same pass as its loss (LinearCrossEntropy).
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from attention import packed_masks
from collate import IGNORE_INDEX


def softcapped_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, softcap: float | None):
    """(loss SUM over the rows of `logits`, d loss / d logits), in FP32, with Gemma's final-logit softcap
    c = softcap * tanh(z / softcap): d loss / d z = (softmax(c) - onehot(target)) * (1 - tanh^2). In place where
    it can be (about three FP32 buffers of the logits' size at the peak); `logits` may be overwritten."""
    tanh = logits.float().div_(softcap).tanh_() if softcap else None
    log_probs = F.log_softmax(tanh * softcap if softcap else logits.float(), dim=-1)
    rows = torch.arange(len(targets), device=log_probs.device)
    loss = -log_probs[rows, targets].sum()
    grad = log_probs.exp_()  # softmax
    grad[rows, targets] -= 1
    if softcap:
        grad.mul_(tanh.square_().neg_().add_(1))
    return loss, grad


# dynamic: each micro-batch's last chunk has a length of its own
compiled_cross_entropy = torch.compile(softcapped_cross_entropy, dynamic=True)


class LinearCrossEntropy(torch.autograd.Function):
    """Loss SUM of the LM head plus softcapped cross-entropy, chunk by chunk, with d loss / d hidden computed in
    the same pass: each chunk's (tokens x 262,144) FP32 logits exist once, briefly, and are neither stored nor
    recomputed in backward, which only scales the stored gradient. The LM head's weight must be frozen (Gemma's
    tied embeddings are): it gets no gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, softcap, chunk):
        grad = torch.empty_like(hidden)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for i in range(0, targets.numel(), chunk):
            logits = F.linear(hidden[i : i + chunk], weight)  # under autocast: the LM head's own BF16 matmul
            part, logit_grad = compiled_cross_entropy(logits, targets[i : i + chunk], softcap)
            grad[i : i + chunk] = logit_grad.to(logits.dtype) @ weight
            loss = loss + part
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss, None, None, None, None


class CausalLMLoss(torch.nn.Module):
    """forward(batch) -> (loss SUM over this micro-batch's targets, number of targets).

    The loss lives inside the module DDP wraps, so DDP's forward prepares the gradient reduction.
    With ce_chunk_tokens > 0 (CE_CHUNK_TOKENS) only target positions reach the LM head, in checkpointed chunks
    of that many tokens: the (tokens x 262,144) FP32 logits are never materialised at once. With compiled
    (COMPILE_LAYERS) and a frozen LM head, training takes each chunk's gradient in the same pass instead
    (LinearCrossEntropy, compiled: softcap, softmax and gradient fused): 7,514 target tokens/s against 6,995 on
    the 12B (bench_results/issue24). Eager, that path measured no faster in the frugal layout and 0.3 GiB higher.
    """

    def __init__(self, peft_model, ce_chunk_tokens: int, compiled: bool = False):
        super().__init__()
        self.lm, self.ce_chunk_tokens = peft_model, ce_chunk_tokens
        causal_lm = peft_model.get_base_model()
        self.decoder, self.lm_head = causal_lm.model, causal_lm.get_output_embeddings()
        text_config = causal_lm.config.get_text_config()
        self.softcap, self.sliding_window = text_config.final_logit_softcapping, text_config.sliding_window
        self.fused = (
            compiled
            and ce_chunk_tokens > 0
            and type(self.lm_head) is torch.nn.Linear
            and self.lm_head.bias is None
            and not self.lm_head.weight.requires_grad
        )

    def logits_loss_sum(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")

    def forward(self, input_ids, attention_mask, labels, right_padded=False, position_ids=None):
        if position_ids is not None:  # packed rows: attention stays inside each conversation
            attention_mask = packed_masks(position_ids, self.sliding_window)
        elif right_padded:
            # Causality alone keeps real tokens off the padding after them (attention.py). A padding mask would
            # also leave each padding query more than a window past its row's end with no key at all: on an H200
            # such batches gave NaN gradients, 7 of 60 steps on a chat mix (bench_results/issue25/session7.txt).
            attention_mask = None
        hidden = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            right_padded=right_padded,
        ).last_hidden_state
        hidden, targets = hidden[:, :-1], labels[:, 1:]  # position t predicts token t+1
        n_targets = (targets != IGNORE_INDEX).sum()
        chunk = self.ce_chunk_tokens
        if chunk <= 0:
            return self.logits_loss_sum(hidden, targets), n_targets
        keep = targets != IGNORE_INDEX
        hidden, targets = hidden[keep], targets[keep]
        if self.fused and torch.is_grad_enabled():
            # No target (an assistant turn cut off by MAX_LEN) still gives a loss whose (zero) gradient reaches
            # every adapter, so backward runs and DDP's reducer gets the gradients it waits for.
            return LinearCrossEntropy.apply(hidden, self.lm_head.weight, targets, self.softcap, chunk), n_targets
        # Eager, a trainable LM head, or evaluation: checkpointed chunks through the module (the same zero).
        loss = hidden.float().sum() * 0.0
        for i in range(0, targets.numel(), chunk):
            loss = loss + checkpoint(
                self.logits_loss_sum, hidden[i : i + chunk], targets[i : i + chunk], use_reentrant=False
            )
        return loss, n_targets
