"""Padding-free packing: whole conversations side by side in rows of MAX_LEN tokens, attention kept inside each.

- rows_of_epoch(): the epoch's rows, the same on every rank (a seeded shuffle, then first fit over a few open
  rows); no conversation is split. Sharded like any dataset, so every rank gets as many rows as the others.
- PackedRows: a dataset of those rows; PackCollate: one batch of rows, all of one width, position_ids
  restarting at each conversation. From those, lm_loss builds masks that keep attention inside each
  conversation (attention.packed_masks).
"""

import torch
from torch.utils.data import Dataset

from collate import IGNORE_INDEX

OPEN_ROWS = 32  # rows still open to first fit: enough for a near-full fill, and linear time


def pack(lengths: list[int], order: list[int], max_len: int) -> list[list[int]]:
    """Indices in `order` packed into rows of at most max_len tokens (each length is at most max_len)."""
    done, open_rows = [], []  # open_rows: [free tokens, indices]
    for i in order:
        row = next((r for r in open_rows if r[0] >= lengths[i]), None)
        if row is None:
            if len(open_rows) == OPEN_ROWS:
                done.append(open_rows.pop(0)[1])
            row = [max_len, []]
            open_rows.append(row)
        row[0] -= lengths[i]
        row[1].append(i)
    return done + [r[1] for r in open_rows]


def rows_of_epoch(lengths: list[int], seed: int, epoch: int, max_len: int) -> list[list[int]]:
    """The epoch's packed rows: a shuffle seeded by (seed, epoch), as DistributedSampler's, then pack()."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return pack(lengths, torch.randperm(len(lengths), generator=g).tolist(), max_len)


class PackedRows(Dataset):
    """Rows of conversations of `dataset` (a ChatDataset): row i is the list of its tokenized conversations."""

    def __init__(self, dataset, rows: list[list[int]]):
        self.dataset, self.rows = dataset, rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return [self.dataset[j] for j in self.rows[i]]


class PackCollate:
    """A batch of packed rows: input_ids, labels and position_ids side by side, right-padded to `width` tokens
    (one shape for every batch: the compiled attention kernels and block masks are built once); attention_mask
    marks real tokens (for counting, never passed to the model). A conversation's first token is no target: the
    token before it belongs to another conversation."""

    def __init__(self, pad_token_id: int, width: int):
        self.pad_token_id, self.width = pad_token_id, width

    def __call__(self, rows: list[list[dict]]) -> dict[str, torch.Tensor]:
        width = self.width
        batch = {
            "input_ids": torch.full((len(rows), width), self.pad_token_id, dtype=torch.long),
            "labels": torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long),
            "position_ids": torch.zeros((len(rows), width), dtype=torch.long),
            "attention_mask": torch.zeros((len(rows), width), dtype=torch.long),
        }
        for r, row in enumerate(rows):
            at = 0
            for ex in row:
                n = len(ex["input_ids"])
                batch["input_ids"][r, at : at + n] = torch.as_tensor(ex["input_ids"])
                batch["labels"][r, at + 1 : at + n] = torch.as_tensor(ex["labels"][1:])
                batch["position_ids"][r, at : at + n] = torch.arange(n)
                batch["attention_mask"][r, at : at + n] = 1
                at += n
            batch["position_ids"][r, at:] = torch.arange(width - at)  # the padding: one more conversation
        return batch
