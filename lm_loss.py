"""The causal-LM loss, inside the module DDP wraps (so DDP's forward prepares the gradient reduction).

CausalLMLoss returns the loss SUM and the number of targets of a micro-batch: train_ddp.forward_backward
weights them into the global token-mean loss. With chunking, only target positions reach the LM head.
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from attention import packed_masks
from collate import IGNORE_INDEX


class CausalLMLoss(torch.nn.Module):
    """forward(batch) -> (loss SUM over this micro-batch's targets, number of targets).

    The loss lives inside the module DDP wraps, so DDP's forward prepares the gradient reduction.
    With ce_chunk_tokens > 0 (CE_CHUNK_TOKENS) only target positions reach the LM head, in chunks whose FP32
    logits are recomputed in backward: the (tokens x 262,144) FP32 logits are never materialised at once.
    """

    def __init__(self, peft_model, ce_chunk_tokens: int):
        super().__init__()
        self.lm, self.ce_chunk_tokens = peft_model, ce_chunk_tokens
        causal_lm = peft_model.get_base_model()
        self.decoder, self.lm_head = causal_lm.model, causal_lm.get_output_embeddings()
        text_config = causal_lm.config.get_text_config()
        self.softcap, self.sliding_window = text_config.final_logit_softcapping, text_config.sliding_window

    def logits_loss_sum(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")

    def forward(self, input_ids, attention_mask, labels, right_padded=False, position_ids=None):
        if position_ids is not None:  # packed rows: attention stays inside each conversation
            attention_mask = packed_masks(position_ids, self.sliding_window)
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
        # No target here (an assistant turn cut off by MAX_LEN): a zero that still reaches every adapter,
        # so backward runs and DDP's reducer gets the (zero) gradients it waits for.
        loss = hidden.float().sum() * 0.0
        for i in range(0, targets.numel(), chunk):
            loss = loss + checkpoint(
                self.logits_loss_sum, hidden[i : i + chunk], targets[i : i + chunk], use_reentrant=False
            )
        return loss, n_targets
