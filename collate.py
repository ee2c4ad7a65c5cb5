"""Padding collation for causal-LM fine-tuning.

PadCollate is a top-level class on purpose: DataLoader workers started with spawn or forkserver
pickle the collate_fn, and a closure or lambda can't be pickled ("Can't get local object ...").
"""

import torch

IGNORE_INDEX = -100  # label value that cross-entropy skips


class PadCollate:
    """Right-pads a list of {"input_ids": [...], "labels": [...]} into batch tensors.

    Pad positions get attention_mask 0 and label IGNORE_INDEX, so they are never targets.
    pad_to_multiple_of rounds the padded length up (tensor-core friendly shapes on GPU).
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int = 1):
        if pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(ex["input_ids"]) for ex in examples)
        width = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
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
