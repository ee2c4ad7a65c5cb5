import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from collate import IGNORE_INDEX, PadCollate


def examples():
    return [
        {"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX, 6, 7]},
        {"input_ids": [8], "labels": [8]},
        {"input_ids": [9, 10, 11, 12, 13], "labels": [9, 10, 11, 12, 13]},
    ]


def test_right_pads_and_pad_positions_are_never_targets():
    batch = PadCollate(pad_token_id=0)(examples())
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [9, 10, 11, 12, 13]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert (batch["labels"][batch["attention_mask"] == 0] == IGNORE_INDEX).all()
    assert batch["labels"][0].tolist() == [IGNORE_INDEX, 6, 7, IGNORE_INDEX, IGNORE_INDEX]


def test_pad_to_multiple_of_rounds_the_width_up_but_never_past_max_len():
    assert PadCollate(0, pad_to_multiple_of=4)(examples())["input_ids"].shape == (3, 8)
    assert PadCollate(0, pad_to_multiple_of=64, max_len=6)(examples())["input_ids"].shape == (3, 6)


def test_mismatched_labels_are_rejected():
    with pytest.raises(ValueError, match="2 input_ids but 1 labels"):
        PadCollate(0)([{"input_ids": [1, 2], "labels": [1]}])


def test_works_in_spawned_dataloader_workers():
    collate = PadCollate(pad_token_id=0)
    pickle.dumps(collate)  # what spawn/forkserver do to the collate_fn
    loader = DataLoader(
        examples() * 4, batch_size=3, num_workers=2, collate_fn=collate, multiprocessing_context="spawn"
    )
    batches = list(loader)
    assert len(batches) == 4
    assert all(torch.equal(b["input_ids"], collate(examples())["input_ids"]) for b in batches)
