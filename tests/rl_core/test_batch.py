"""Batch helpers: the layout rule, sharding, micro-batching, padding."""

import pytest
import torch

from rl_core.contracts import batch as B


def make(rows):
    ids, attn = B.pad_rows(rows, pad_id=0)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": attn.float(), "row": torch.arange(len(rows))}


def test_pad_rows():
    ids, attn = B.pad_rows([[5, 6, 7], [8]], pad_id=1)
    assert ids.tolist() == [[5, 6, 7], [8, 1, 1]]
    assert attn.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_split_keeps_groups_and_order():
    b = make([[1]] * 8)
    parts = B.split(b, 2, group_size=2)
    assert [p["row"].tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="whole groups"):
        B.split(make([[1]] * 6), 2, group_size=2)


def test_micro_batches_last_shorter():
    parts = B.micro_batches(make([[1]] * 5), 2)
    assert [p["row"].tolist() for p in parts] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="multiple of the loss's group size"):
        B.micro_batches(make([[1]] * 4), 3, group_size=2)


def test_token_budget_micro_batches():
    # lengths 2, 2, 4, 1: budget 4 -> [0,1] (2x2), [2] (1x4), [3] (1x1); each trimmed to its longest row
    parts = B.token_budget_micro_batches(make([[1, 1], [1, 1], [1, 1, 1, 1], [1]]), max_tokens=4)
    assert [p["row"].tolist() for p in parts] == [[0, 1], [2], [3]]
    assert [p["input_ids"].shape[1] for p in parts] == [2, 4, 1]


def test_longest_first_orders_whole_groups_by_their_longest_row():
    # groups of two: lengths (1, 2), (4, 1), (2, 2) -> longest rows 2, 4, 2 -> group 1, then 0 and 2 as they were
    b = make([[1], [1, 1], [1, 1, 1, 1], [1], [1, 1], [1, 1]])
    assert B.longest_first(b, group_size=2).tolist() == [2, 3, 0, 1, 4, 5]
    assert B.longest_first(b).tolist() == [2, 1, 4, 5, 0, 3]


def test_pad_to_multiple_adds_inert_rows():
    padded, rows = B.pad_to_multiple(make([[1, 2], [3, 4], [5, 6]]), 4)
    assert rows == 3 and B.num_rows(padded) == 4
    assert padded["loss_mask"][3].sum() == 0 and padded["attention_mask"][3].tolist() == [1, 0]


def test_concat_pads_to_widest():
    out = B.concat([make([[1]]), make([[1, 2, 3]])])
    assert out["input_ids"].shape == (2, 3)


def test_a_batch_that_breaks_the_layout_is_refused_naming_the_rule_and_the_row():
    from rl_core.base.errors import InputError

    ids, attn = B.pad_rows([[5, 6, 7], [8, 9]], 0)
    loss = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    B.check_layout({"input_ids": ids, "attention_mask": attn, "loss_mask": loss})  # right-padded: fine
    left = torch.tensor([[1, 1, 1], [0, 1, 1]])
    with pytest.raises(InputError, match=r"batch row 1 is not right-padded: .*pad_rows"):
        B.check_layout({"input_ids": ids, "attention_mask": left, "loss_mask": loss * left})
    with pytest.raises(InputError, match=r"batch row 1 has loss_mask set on padding"):
        B.check_layout({"input_ids": ids, "attention_mask": attn, "loss_mask": torch.ones(2, 3)})
    with pytest.raises(InputError, match=r"one shape \[B, T\]"):
        B.check_layout({"input_ids": ids, "attention_mask": attn, "loss_mask": loss[:, :2]})
    with pytest.raises(InputError, match=r"a batch needs loss_mask"):
        B.check_layout({"input_ids": ids, "attention_mask": attn})
