"""Advantage estimators and reward shaping, as pure functions over small tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def group_advantages(
    rewards: torch.Tensor,
    valid: torch.Tensor,
    *,
    leave_one_out: bool,
    normalize: bool,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages of ``G`` samples for each of ``P`` prompts, ``rewards [P, G] -> [P, G]``.

    Over the valid samples of a group (``valid [P, G]``, ``n`` of them):
    mean baseline ``b_i = (1/n) sum_j r_j``, or leave-one-out ``b_i = (1/(n-1)) sum_{j != i} r_j``;
    ``A_i = r_i - b_i``. With ``normalize``, ``A_i /= std + eps`` where ``std`` is the unbiased standard
    deviation of the group's valid rewards (no division when it is 0). Masked samples get 0; a group with a
    single valid sample gets 0 (no baseline can be formed).
    """
    import torch

    valid = valid.to(rewards.dtype)
    n = valid.sum(1, keepdim=True)  # [P, 1]
    total = (rewards * valid).sum(1, keepdim=True)  # [P, 1]
    mean = total / n.clamp(min=1.0)
    if leave_one_out:
        baseline = (total - rewards) / (n - 1.0).clamp(min=1.0)  # [P, G]
    else:
        baseline = mean.expand_as(rewards)
    adv = torch.where(n > 1, rewards - baseline, torch.zeros_like(rewards)) * valid
    if normalize:
        var = (((rewards - mean) ** 2) * valid).sum(1, keepdim=True) / (n - 1.0).clamp(min=1.0)
        std = var.sqrt()
        adv = torch.where(std > 0, adv / (std + eps), adv)
    return adv


def kl_penalized_rewards(
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """NeMo-Aligner's REINFORCE reward: ``r_i - beta * sum_t m_it (logp_it - logp_ref_it)``.
    ``rewards [N]``, the others ``[N, T]`` -> ``[N]``."""
    return rewards - beta * ((logprobs - reference_logprobs) * mask).sum(1)


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment for response ``lengths [N] -> [N]``:
    0 up to ``max_length - buffer``; then falling linearly to ``-penalty`` at ``max_length``; ``-penalty`` beyond."""
    start = max_length - buffer
    return -penalty * ((lengths.float() - start) / max(buffer, 1)).clamp(0.0, 1.0)


def distillation_advantages(
    logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    task_advantages: torch.Tensor | None = None,
    task_weight: float = 0.0,
) -> torch.Tensor:
    """On-policy distillation's per-token advantage: the negative reverse KL of each sampled token (the student's
    own samples), optionally plus a weighted task advantage of the whole sample.
    ``A_it = m_it * (-(log pi(x_it) - log pi_T(x_it)) + w * A_i)``; ``logprobs``, ``teacher_logprobs``, ``mask``
    ``[N, T]``, ``task_advantages [N]`` -> ``[N, T]``. Each token's own term only (no sum over later tokens): its
    expectation under the student is the reverse KL ``KL(pi || pi_T)`` at that position."""
    adv = -(logprobs - teacher_logprobs)  # [N, T]
    if task_advantages is not None and task_weight:
        adv = adv + task_weight * task_advantages[:, None]
    return adv * mask
