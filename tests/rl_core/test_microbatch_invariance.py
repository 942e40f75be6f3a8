"""Splitting one global batch into 1, 2 or 4 micro-batches, or across 2 data-parallel ranks, gives the same loss
and gradients: the losses are sums divided by a global normaliser."""

import pytest
import torch

from rl_core.base.schema import LossConfig
from rl_core.contracts import batch as B
from rl_core.contracts import tokens as T
from rl_core.training.losses import ClippedPGLoss, DPOLoss, NLLLoss


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(11, 8)
        self.out = torch.nn.Linear(8, 11)

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


def global_batch() -> dict:
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 11, (int(n),), generator=g).tolist() for n in torch.randint(3, 9, (8,), generator=g)]
    ids, attn = B.pad_rows(rows, 0)
    loss_mask = attn.float()
    loss_mask[:, :2] = 0.0
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss_mask,
        "advantages": torch.randn(8, 1, generator=g) * loss_mask,
        "prev_logprobs": -torch.rand(ids.shape, generator=g) * attn,
        "reference_logprobs": -torch.rand(ids.shape, generator=g) * attn,
    }


def loss_and_grads(model, loss_fn, batch, ranks: int, micro: int):
    model.zero_grad()
    normalizer = loss_fn.count(batch)
    total = 0.0
    for shard in B.split(batch, ranks, loss_fn.group_size):
        for mb in B.micro_batches(shard, micro, loss_fn.group_size):
            logprobs = T.token_logprobs(model(mb["input_ids"]), mb["input_ids"]) * mb["attention_mask"]
            loss, _ = loss_fn(mb, logprobs, normalizer)
            loss.backward()  # gradients of all micro-batches and ranks add up (as an all-reduce sum would)
            total += float(loss.detach())
    return total, [p.grad.clone() for p in model.parameters()]


LOSSES = [
    ClippedPGLoss(cfg=LossConfig(reference_policy_kl_penalty=0.1)),
    ClippedPGLoss(cfg=LossConfig(token_level_loss=False)),
    NLLLoss(),
    DPOLoss(beta=0.3),
]


@pytest.mark.parametrize("loss_fn", LOSSES, ids=["pg-token-kl", "pg-sequence", "nll", "dpo"])
def test_split_invariance(loss_fn):
    model, batch = TinyLM(), global_batch()
    ref_loss, ref_grads = loss_and_grads(model, loss_fn, batch, ranks=1, micro=8)
    for ranks, micro in [(1, 4), (1, 2), (2, 4), (2, 2)]:
        loss, grads = loss_and_grads(model, loss_fn, batch, ranks, micro)
        assert loss == pytest.approx(ref_loss, abs=1e-6)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)
