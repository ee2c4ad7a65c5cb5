"""How samples become micro-batches: their order within an optimizer step, and padding.

StepOrder groups similar lengths within each optimizer step of a rank's DistributedSampler order.
PadCollate is a top-level class on purpose: DataLoader workers started with spawn or forkserver
pickle the collate_fn, and a closure or lambda can't be pickled ("Can't get local object ...").
"""

import torch
from torch.utils.data import DistributedSampler, Sampler

IGNORE_INDEX = -100  # label value that cross-entropy skips


class PadCollate:
    """Right-pads a list of {"input_ids": [...], "labels": [...]} into batch tensors.

    Pad positions get attention_mask 0 and label IGNORE_INDEX, so they are never targets.
    pad_to_multiple_of rounds the padded length up (tensor-core friendly shapes on GPU), never past max_len
    (the samples' own limit): a multiple larger than MAX_LEN would pad every row beyond it.
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int = 1, max_len: int | None = None):
        if pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.max_len = max_len

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(ex["input_ids"]) for ex in examples)
        width = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        width = max(longest, min(width, self.max_len or width))
        input_ids = torch.full((len(examples), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
        for row, ex in enumerate(examples):
            n = len(ex["input_ids"])
            if len(ex["labels"]) != n:
                raise ValueError(f"example {row}: {n} input_ids but {len(ex['labels'])} labels")
            input_ids[row, :n] = torch.as_tensor(ex["input_ids"], dtype=torch.long)
            labels[row, :n] = torch.as_tensor(ex["labels"], dtype=torch.long)
            attention_mask[row, :n] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class StepOrder(Sampler):
    """A rank's DistributedSampler order, without its first `skip` indices (resuming mid-epoch).

    With `lengths`, each window of `window` samples (one optimizer step of this rank) is sorted by
    length: similar lengths share a micro-batch (less padding), while the samples of every optimizer
    step, and so the update, stay exactly those of the shuffled order.
    """

    def __init__(self, sampler: DistributedSampler, skip: int, lengths: list[int] | None = None, window: int = 1):
        self.sampler, self.skip, self.lengths, self.window = sampler, skip, lengths, window

    def __iter__(self):
        order = list(self.sampler)
        if self.lengths is not None:
            order = [
                i
                for start in range(0, len(order), self.window)
                for i in sorted(order[start : start + self.window], key=lambda i: -self.lengths[i])
            ]
        return iter(order[self.skip :])

    def __len__(self):
        return len(self.sampler) - self.skip
