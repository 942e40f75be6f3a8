"""Batch helpers: sharding, micro-batching, packing, padding."""

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


def test_pack_unpack_roundtrip():
    b = make([[3, 4, 5], [6]])
    ids, pos, lengths = B.pack(b["input_ids"], b["attention_mask"])
    assert ids.tolist() == [[3, 4, 5, 6]] and pos.tolist() == [[0, 1, 2, 0]] and lengths == [3, 1]
    assert B.unpack(ids.float(), lengths, 3).tolist() == [[3, 4, 5], [6, 0, 0]]


def test_pad_to_multiple_adds_inert_rows():
    padded, rows = B.pad_to_multiple(make([[1, 2], [3, 4], [5, 6]]), 4)
    assert rows == 3 and B.num_rows(padded) == 4
    assert padded["loss_mask"][3].sum() == 0 and padded["attention_mask"][3].tolist() == [1, 0]


def test_concat_pads_to_widest():
    out = B.concat([make([[1]]), make([[1, 2, 3]])])
    assert out["input_ids"].shape == (2, 3)


def test_token_logprobs_alignment():
    # logits favour token 2 everywhere; position t holds log p(x_t | x_<t), position 0 holds 0
    logits = torch.zeros((1, 3, 4))
    logits[..., 2] = 10.0
    ids = torch.tensor([[0, 2, 1]])
    lp = B.token_logprobs(logits, ids)
    expected_hit = torch.log_softmax(logits[0, 0], -1)[2]
    expected_miss = torch.log_softmax(logits[0, 1], -1)[1]
    assert lp[0, 0] == 0 and torch.isclose(lp[0, 1], expected_hit) and torch.isclose(lp[0, 2], expected_miss)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_token_logprobs_equal_the_whole_ones_values_and_gradients(dtype):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 11, 17, generator=g).to(dtype).requires_grad_(True)
    ids = torch.randint(0, 17, (3, 11), generator=g)
    weights = torch.randn(3, 11, generator=g)
    whole = B.token_logprobs(logits, ids)
    (grad_whole,) = torch.autograd.grad((whole * weights).sum(), logits)
    for chunk in (1, 4, 10, 64):
        part = B.token_logprobs(logits, ids, chunk_tokens=chunk)
        (grad_part,) = torch.autograd.grad((part * weights).sum(), logits)
        assert torch.equal(part, whole), chunk
        assert torch.allclose(grad_part.float(), grad_whole.float(), atol=1e-6), chunk


def test_shared_prefixes_cut_rows_where_their_loss_begins():
    """Rows of varied lengths, two of them one prompt's samples: each distinct prompt once (up to the token before
    the one that predicts the first loss token), each row's suffix from there, padded, with its columns."""
    ids, attn = B.pad_rows([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7], [9, 8, 3, 4, 5]], 0)
    need = torch.zeros(ids.shape)
    need[0, 4:6] = need[1, 4:5] = need[2, 3:5] = 1  # responses: [5, 6], [7], [4, 5]
    split = B.split_shared_prefixes(ids, attn, need)
    assert split is not None
    assert split.prefix_ids.tolist() == [[1, 2, 3], [9, 8, 0]] and split.prefix_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert split.row_prefix.tolist() == [0, 0, 1]
    assert split.suffix_index.tolist() == [[3, 4, 5], [3, 4, 5], [2, 3, 4]]  # clamped past a row's end
    assert split.suffix_mask.tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 1]]
    rebuilt = torch.cat([split.prefix_ids[0], ids[0, split.suffix_index[0]]])
    assert rebuilt.tolist() == ids[0].tolist()


def test_rows_with_nothing_to_share_are_not_split():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 300, (3, 10), generator=g)
    need = torch.zeros(3, 10)
    need[:, 6:] = 1
    assert B.split_shared_prefixes(ids, torch.ones_like(ids), need) is None, "three different prompts"
    ids[1] = ids[0]
    assert B.split_shared_prefixes(ids, torch.ones_like(ids), need) is not None
    need[2, 1] = 1  # a loss from the second token on: an empty prefix, nothing to run it on
    assert B.split_shared_prefixes(ids, torch.ones_like(ids), need) is None
