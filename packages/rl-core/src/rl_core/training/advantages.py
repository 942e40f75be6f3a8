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


def kl_to_go(logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++'s token-level KL in the reward, as each token's return (no discount): ``K_t = sum_{s >= t}
    m_s (logp_s - logp_ref_s)``, the k1 estimate summed over the sequence's loss tokens from ``t`` on;
    ``[N, T] -> [N, T]``, 0 where ``mask`` is 0. A token's advantage is then its sequence's minus ``beta * K_t``."""
    kl = (logprobs - reference_logprobs) * mask  # [N, T]
    return kl.flip(1).cumsum(1).flip(1) * mask


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


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each row's action tokens, ``rewards``, ``values``, ``mask [N, T] ->
    (advantages, returns) [N, T]``.

    The steps of a row are its positions with ``mask`` set, in order (positions between them, an environment's
    observation tokens, are skipped, not steps); after the last the episode has ended (next value 0). For steps
    ``t`` and the next step ``t'``::

        delta_t = r_t + gamma * V_t' - V_t
        A_t     = delta_t + gamma * lam * A_t'
        R_t     = A_t + V_t                     (the critic's target)

    Both are 0 where ``mask`` is 0."""
    import torch

    mask = mask.float()
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])  # [N]
    next_advantage = values.new_zeros(values.shape[0])  # [N]
    for t in reversed(range(values.shape[1])):
        step = mask[:, t] > 0  # [N]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(step, advantage, 0.0)
        next_value = torch.where(step, values[:, t], next_value)
        next_advantage = torch.where(step, advantage, next_advantage)
    return advantages, (advantages + values) * mask


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the positions where ``mask [N, T]`` is set (the unbiased variance),
    0 elsewhere; ``values [N, T] -> [N, T]``. Fewer than two positions: centred only."""
    mask = mask.float()
    n = mask.sum()
    mean = (values * mask).sum() / n.clamp(min=1.0)
    centred = (values - mean) * mask
    if n < 2:
        return centred
    var = centred.square().sum() / (n - 1.0)
    return centred / (var + eps).sqrt()


def last_position(mask: torch.Tensor) -> torch.Tensor:
    """``[N, T] -> [N, T]``: 1 at each row's last position with ``mask`` set (where a sample's reward is given
    in a per-token reward), 0 elsewhere and on rows without any."""
    import torch

    mask = mask.float()
    T = mask.shape[1]
    index = (mask * torch.arange(1, T + 1, dtype=mask.dtype)).argmax(1)  # [N]
    out = torch.zeros_like(mask)
    out[torch.arange(mask.shape[0]), index] = 1.0
    return out * (mask.sum(1, keepdim=True) > 0)
