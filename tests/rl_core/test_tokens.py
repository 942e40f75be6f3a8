"""Token maths: log-probabilities from logits (whole and chunked), packing, shared-prefix splits."""

import pytest
import torch

from rl_core.contracts import batch as B
from rl_core.contracts import tokens as T


def test_pack_unpack_roundtrip():
    ids, attn = B.pad_rows([[3, 4, 5], [6]], pad_id=0)
    ids, pos, lengths = T.pack(ids, attn)
    assert ids.tolist() == [[3, 4, 5, 6]] and pos.tolist() == [[0, 1, 2, 0]] and lengths == [3, 1]
    assert T.unpack(ids.float(), lengths, 3).tolist() == [[3, 4, 5], [6, 0, 0]]


def test_token_logprobs_alignment():
    # logits favour token 2 everywhere; position t holds log p(x_t | x_<t), position 0 holds 0
    logits = torch.zeros((1, 3, 4))
    logits[..., 2] = 10.0
    ids = torch.tensor([[0, 2, 1]])
    lp = T.token_logprobs(logits, ids)
    expected_hit = torch.log_softmax(logits[0, 0], -1)[2]
    expected_miss = torch.log_softmax(logits[0, 1], -1)[1]
    assert lp[0, 0] == 0 and torch.isclose(lp[0, 1], expected_hit) and torch.isclose(lp[0, 2], expected_miss)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_token_logprobs_equal_the_whole_ones_values_and_gradients(dtype):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 11, 17, generator=g).to(dtype).requires_grad_(True)
    ids = torch.randint(0, 17, (3, 11), generator=g)
    weights = torch.randn(3, 11, generator=g)
    whole = T.token_logprobs(logits, ids)
    (grad_whole,) = torch.autograd.grad((whole * weights).sum(), logits)
    for chunk in (1, 4, 10, 64):
        part = T.token_logprobs(logits, ids, chunk_tokens=chunk)
        (grad_part,) = torch.autograd.grad((part * weights).sum(), logits)
        assert torch.equal(part, whole), chunk
        assert torch.allclose(grad_part.float(), grad_whole.float(), atol=1e-6), chunk


def test_shared_prefixes_cut_rows_where_their_loss_begins():
    """Rows of varied lengths, two of them one prompt's samples: each distinct prompt once (up to the token before
    the one that predicts the first loss token), each row's suffix from there, padded, with its columns."""
    ids, attn = B.pad_rows([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7], [9, 8, 3, 4, 5]], 0)
    need = torch.zeros(ids.shape)
    need[0, 4:6] = need[1, 4:5] = need[2, 3:5] = 1  # responses: [5, 6], [7], [4, 5]
    split = T.split_shared_prefixes(ids, attn, need)
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
    assert T.split_shared_prefixes(ids, torch.ones_like(ids), need) is None, "three different prompts"
    ids[1] = ids[0]
    assert T.split_shared_prefixes(ids, torch.ones_like(ids), need) is not None
    need[2, 1] = 1  # a loss from the second token on: an empty prefix, nothing to run it on
    assert T.split_shared_prefixes(ids, torch.ones_like(ids), need) is None
