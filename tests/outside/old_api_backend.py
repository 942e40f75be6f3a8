"""A backend's training step as an outside plugin wrote it against rl-core 0.1's API before the token maths moved
to ``rl_core.api.tokens`` (kept verbatim: the public-API test runs it unmodified)."""

import torch

from rl_core.api import ClippedPGLoss, LossConfig, batch


def train_step(model: torch.nn.Module, rows: dict, micro_batch_size: int) -> tuple[float, list[torch.Tensor]]:
    loss_fn = ClippedPGLoss(cfg=LossConfig())
    normalizer = loss_fn.count(rows)
    model.zero_grad()
    total = 0.0
    for mb in batch.micro_batches(rows, micro_batch_size, loss_fn.group_size):
        logprobs = batch.token_logprobs(model(mb["input_ids"]), mb["input_ids"]) * mb["attention_mask"]
        loss, _ = loss_fn(mb, logprobs, normalizer)
        loss.backward()
        total += float(loss.detach())
    return total, [p.grad.clone() for p in model.parameters()]
