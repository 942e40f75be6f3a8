"""Loss functions: pure, with their formula, shape comments and an explicit global normaliser.

Each loss is a frozen attrs object (its settings) whose ``__call__(batch, logprobs, normalizer)`` returns
``(loss, metrics)``. The loss is a *sum* over the rows given divided by ``normalizer``, which the caller computes
with ``count`` over the whole optimizer-step batch (all data-parallel ranks and micro-batches together). Summing
the losses and metrics of all micro-batches therefore gives the global value however the batch was split.
Metrics are returned as tensors with the same normalisation, to be summed the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from rl_core.base.errors import InputError
from rl_core.base.schema import LossConfig

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from rl_core.contracts.batch import PolicyGradientBatch, PreferenceBatch, ScoredPairBatch, TokenBatch, ValueBatch


def kl_estimate(
    logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    kind: str,
    input_clamp: float | None = None,
    output_clamp: float | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi.

    With ``r = log pi_ref(x) - log pi(x)`` (clamped to ``[-input_clamp, input_clamp]``):
    ``k1 = -r``, ``k2 = r^2 / 2``, ``k3 = exp(r) - r - 1``; the result is clamped to
    ``[-output_clamp, output_clamp]``. Shapes: ``[B, T] -> [B, T]``.
    """
    import torch

    r = reference_logprobs - logprobs  # [B, T]
    if input_clamp is not None:
        r = r.clamp(-input_clamp, input_clamp)
    if kind == "k1":
        kl = -r
    elif kind == "k2":
        kl = 0.5 * r.square()
    elif kind == "k3":
        kl = torch.exp(r) - r - 1.0
    else:
        raise ValueError(f"unknown KL estimator {kind!r}; use k1, k2 or k3")
    if output_clamp is not None:
        kl = kl.clamp(-output_clamp, output_clamp)
    return kl


def check_devices(batch: Mapping[str, Any], logprobs: torch.Tensor) -> None:
    """Every tensor of ``batch`` on the device of ``logprobs``, or an error naming the key: a backend must move the
    batch it trains on to its device before the loss reads it."""
    for key, value in batch.items():
        if value.device != logprobs.device:
            raise InputError(
                f"batch[{key!r}] is on {value.device} but the logprobs are on {logprobs.device}: the training "
                "backend must move every batch tensor to its device before calling the loss (rl_core.contracts.batch.to_device)"
            )


def _loss_mask(batch: Mapping[str, Any]) -> torch.Tensor:
    mask = batch["loss_mask"].float()  # [B, T]
    if "sample_mask" in batch:
        mask = mask * batch["sample_mask"].float().unsqueeze(1)
    return mask


def _sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's mean over its masked positions, ``[B, T] -> [B, 1]`` (0 for a row without any)."""
    return (values * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)


@attrs.frozen(kw_only=True)
class ClippedPGLoss:
    """The policy-gradient loss of PPO/GRPO and its variants: DAPO's asymmetric clip, dual clip, GSPO's sequence
    ratio, CISPO, importance-sampling correction and masks against the engine's logprobs, a KL penalty to the
    reference policy, and token, sequence or constant (Dr. GRPO) normalisation.

    Per token of sequence ``i``, with advantage ``A``, ``eps_lo = ratio_clip_min``, ``eps_hi = ratio_clip_max``,
    ``m`` the loss mask, ``sg`` no gradient::

        log rho = logp - logp_prev                              importance_ratio: token
        log rho = sum_t m_t (logp_t - logp_prev_t) / sum_t m_t  sequence (GSPO), the same for every token
        log rho = sg(that) + logp - sg(logp)                    sequence_token (GSPO-token)
        pg  = max(-A * rho, -A * clip(rho, 1 - eps_lo, 1 + eps_hi))          policy_objective: clipped
        pg  = min(pg, -A * c)                  where A < 0, if ratio_clip_c = c is set (dual clip)
        pg  = -A * sg(clip(rho, 1 - eps_lo, 1 + eps_hi)) * logp             policy_objective: cispo
        pg  = -A * logp                        if disable_ppo_ratio (plain REINFORCE)
        w   = min(exp(logp_prev - logp_gen), tis)   if use_importance_sampling_correction (else 1), no gradient
        w  *= [low <= q <= high]               if mismatch_mask: q = exp(logp_prev - logp_gen) per token, or
                                               per sequence exp(mean_t (logp_prev - logp_gen)), no gradient
        kl  = k(logp, logp_ref)                see ``kl_estimate``
        kl *= exp(logp - logp_prev)            if use_on_policy_kl_approximation (no gradient through the weight)
        l   = w * (pg + beta * kl)
        d   = logp - logp_gen                  reported (no gradient), where the engine's logprobs are in the batch:
                                               mean |d| and the k3 estimate exp(d) - d - 1 of KL(engine || trainer)

    Token level: ``loss = sum_{b,t} m_bt l_bt / N_tokens``. Sequence level: ``loss = sum_b (sum_t m_bt l_bt /
    sum_t m_bt) / N_sequences``. Constant (Dr. GRPO): ``loss = sum_{b,t} m_bt l_bt / (N_sequences * C)``. ``N``
    is the global count (``count``).
    """

    cfg: LossConfig = attrs.Factory(LossConfig)
    group_size: int = 1

    def count(self, batch: PolicyGradientBatch) -> float:
        mask = _loss_mask(batch)
        sequences = float((mask.sum(1) > 0).sum())
        if self.cfg.constant_normalizer is not None:
            return sequences * self.cfg.constant_normalizer
        return float(mask.sum()) if self.cfg.token_level_loss else sequences

    def __call__(
        self, batch: PolicyGradientBatch, logprobs: torch.Tensor, normalizer: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        import torch

        check_devices(batch, logprobs)
        cfg = self.cfg
        mask = _loss_mask(batch)  # [B, T]
        adv = batch["advantages"].float()  # [B, T]
        prev = batch.get("prev_logprobs", logprobs.detach())  # [B, T]
        # only where the loss counts: a backend may leave logprobs elsewhere at 0 (see ``LossFunction``)
        log_ratio = torch.where(mask > 0, logprobs - prev, 0.0)  # [B, T]
        metrics: dict[str, torch.Tensor] = {}
        if cfg.disable_ppo_ratio:
            pg = -adv * logprobs  # [B, T]
            ratio = torch.ones_like(logprobs)
        else:
            ratio = torch.exp(self._policy_log_ratio(log_ratio, logprobs, mask))  # [B, T]
            clipped = ratio.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
            if cfg.policy_objective == "cispo":
                pg = -adv * clipped.detach() * logprobs
                metrics["clip_fraction"] = self._reduce((clipped != ratio).float(), mask, normalizer)
            else:
                pg = torch.maximum(-adv * ratio, -adv * clipped)
                metrics["clip_fraction"] = self._reduce(((-adv * clipped) > (-adv * ratio)).float(), mask, normalizer)
                if cfg.ratio_clip_c is not None:
                    dual = torch.minimum(pg, -adv * cfg.ratio_clip_c)
                    pg = torch.where(adv < 0, dual, pg)
        weight = torch.ones_like(logprobs)
        if cfg.use_importance_sampling_correction:
            weight = torch.exp(prev - batch["generation_logprobs"]).detach()  # [B, T]
            if cfg.truncated_importance_sampling_ratio is not None:
                weight = weight.clamp(max=cfg.truncated_importance_sampling_ratio)
        if cfg.mismatch_mask is not None:
            keep = self._mismatch_keep(batch, prev, mask)  # [B, T]
            metrics["mismatch_masked_fraction"] = self._reduce(1.0 - keep, mask, normalizer)
            weight = weight * keep
        per_token = pg
        if cfg.reference_policy_kl_penalty > 0:
            kl = kl_estimate(
                logprobs,
                batch["reference_logprobs"],
                cfg.reference_policy_kl_type,
                cfg.kl_input_clamp_value,
                cfg.kl_output_clamp_value,
            )
            if cfg.use_on_policy_kl_approximation:
                kl = torch.exp(log_ratio).detach() * kl
            per_token = per_token + cfg.reference_policy_kl_penalty * kl
            metrics["kl"] = self._reduce(kl.detach() * weight, mask, normalizer)
        per_token = weight * per_token  # [B, T]
        loss = self._reduce(per_token, mask, normalizer)
        if "generation_logprobs" in batch:  # the engine's logprobs against these, at no extra cost
            drift = torch.where(mask > 0, logprobs.detach() - batch["generation_logprobs"], 0.0)  # [B, T]
            metrics["engine_logprob_abs_diff"] = self._reduce(drift.abs(), mask, normalizer)
            metrics["engine_logprob_kl"] = self._reduce(torch.exp(drift) - drift - 1, mask, normalizer)
        metrics["pg_loss"] = self._reduce((weight * pg).detach(), mask, normalizer)
        metrics["ratio"] = self._reduce(ratio.detach(), mask, normalizer)
        metrics["loss"] = loss.detach()
        return loss, metrics

    def _policy_log_ratio(self, log_ratio: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The log importance ratio at ``importance_ratio``'s level, ``[B, T] -> [B, T]`` (0 off the mask)."""
        import torch

        if self.cfg.importance_ratio == "token":
            return log_ratio
        sequence = _sequence_mean(log_ratio, mask)  # [B, 1]
        if self.cfg.importance_ratio == "sequence":
            per_token = sequence.expand_as(log_ratio)
        else:  # sequence_token: the sequence's value, each token's own gradient
            per_token = sequence.detach() + logprobs - logprobs.detach()
        return torch.where(mask > 0, per_token, 0.0)

    def _mismatch_keep(self, batch: PolicyGradientBatch, prev: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """1 where the trainer-vs-engine ratio is within the mask's bounds, else 0, ``[B, T]`` (no gradient)."""
        import torch

        if "generation_logprobs" not in batch:
            raise InputError(
                "loss_fn.mismatch_mask compares with the engine's logprobs, but the batch has no generation_logprobs; "
                "put the engine's logprobs of the sampled tokens there, or set loss_fn.mismatch_mask=null"
            )
        log_q = torch.where(mask > 0, prev.detach() - batch["generation_logprobs"], 0.0)  # [B, T]
        if self.cfg.mismatch_mask == "sequence":
            log_q = _sequence_mean(log_q, mask).expand_as(log_q)
        q = torch.exp(log_q)
        keep = torch.ones_like(q, dtype=torch.bool)
        if self.cfg.mismatch_mask_low is not None:
            keep &= q >= self.cfg.mismatch_mask_low
        if self.cfg.mismatch_mask_high is not None:
            keep &= q <= self.cfg.mismatch_mask_high
        return keep.float()

    def _reduce(self, values: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
        if self.cfg.token_level_loss or self.cfg.constant_normalizer is not None:
            return (values * mask).sum() / normalizer
        per_seq = (values * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # [B]
        return per_seq.sum() / normalizer


@attrs.frozen(kw_only=True)
class NLLLoss:
    """Negative log-likelihood of the masked tokens (SFT): ``loss = -sum_{b,t} m_bt logp_bt / N_tokens``."""

    group_size: int = 1

    def count(self, batch: TokenBatch) -> float:
        return float(_loss_mask(batch).sum())

    def __call__(
        self, batch: TokenBatch, logprobs: torch.Tensor, normalizer: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        check_devices(batch, logprobs)
        mask = _loss_mask(batch)  # [B, T]
        loss = -(logprobs * mask).sum() / normalizer
        return loss, {"loss": loss.detach()}


@attrs.frozen(kw_only=True)
class DPOLoss:
    """Direct preference optimisation over interleaved pairs (row 2i chosen, row 2i+1 rejected).

    With sequence log-probabilities ``s = sum_t m_t logp_t`` (divided by ``sum_t m_t`` if ``average_log_probs``),
    and the same ``s_ref`` under the reference policy (0 if ``reference_free``)::

        z     = beta * ((s_c - s_ref_c) - (s_r - s_ref_r))
        l     = -log sigmoid(z) + sft_loss_weight * (-sum_t m_t logp_t / sum_t m_t)   (chosen row)
        loss  = sum_pairs l / N_pairs
    """

    beta: float = 0.1
    reference_free: bool = False
    sft_loss_weight: float = 0.0
    average_log_probs: bool = False
    group_size: int = 2

    def count(self, batch: PreferenceBatch) -> float:
        return batch["input_ids"].shape[0] / 2

    def __call__(
        self, batch: PreferenceBatch, logprobs: torch.Tensor, normalizer: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        import torch

        check_devices(batch, logprobs)
        mask = _loss_mask(batch)  # [B, T]
        lengths = mask.sum(1).clamp(min=1.0)  # [B]
        seq = (logprobs * mask).sum(1)  # [B]
        ref = torch.zeros_like(seq) if self.reference_free else (batch["reference_logprobs"] * mask).sum(1)
        if self.average_log_probs:
            seq, ref = seq / lengths, ref / lengths
        chosen, rejected = seq[0::2] - ref[0::2], seq[1::2] - ref[1::2]  # [P]
        z = self.beta * (chosen - rejected)  # [P]
        per_pair = -torch.nn.functional.logsigmoid(z)
        if self.sft_loss_weight:
            nll_chosen = -(logprobs[0::2] * mask[0::2]).sum(1) / lengths[0::2]
            per_pair = per_pair + self.sft_loss_weight * nll_chosen
        loss = per_pair.sum() / normalizer
        metrics = {
            "loss": loss.detach(),
            "accuracy": (z > 0).float().sum() / normalizer,
            "margin": (z.detach() / self.beta).sum() / normalizer,
        }
        return loss, metrics


@attrs.frozen(kw_only=True)
class BradleyTerryLoss:
    """Reward-model training on interleaved pairs (row 2i chosen, row 2i+1 rejected), Bradley-Terry.

    The backend's per-token output is the score head's value ``v [B, T]``; each row's reward is the value at its
    one ``loss_mask`` position (the token the model is read at when it serves: the row's last), ``r = sum_t m_t
    v_t``. With the pairs' margins (``batch["margin"] [B]``, each pair's on both its rows; 0 when absent)::

        z     = r_c - r_r - margin
        loss  = sum_pairs -log sigmoid(z) / N_pairs

    Metrics: ``accuracy`` (share of pairs with ``r_c > r_r``), the mean chosen and rejected rewards and their gap.
    """

    group_size: int = 2

    def count(self, batch: ScoredPairBatch) -> float:
        return batch["input_ids"].shape[0] / 2

    def __call__(
        self, batch: ScoredPairBatch, values: torch.Tensor, normalizer: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        import torch

        check_devices(batch, values)
        reward = (values * batch["loss_mask"]).sum(1)  # [B]
        chosen, rejected = reward[0::2], reward[1::2]  # [P]
        margin = batch["margin"][0::2] if "margin" in batch else torch.zeros_like(chosen)  # [P]
        loss = -torch.nn.functional.logsigmoid(chosen - rejected - margin).sum() / normalizer
        gap = (chosen - rejected).detach()  # [P]
        return loss, {
            "loss": loss.detach(),
            "accuracy": (gap > 0).float().sum() / normalizer,
            "reward_chosen": chosen.detach().sum() / normalizer,
            "reward_rejected": rejected.detach().sum() / normalizer,
            "reward_gap": gap.sum() / normalizer,
        }


@attrs.frozen(kw_only=True)
class ValueLoss:
    """PPO's critic loss, token level, with value clipping.

    The backend's per-token output is the score head's value ``v [B, T]``; ``loss_mask`` marks the positions whose
    value is a state's (for PPO: the position before each action token, ``rl_core.algorithms.ppo``), with their
    targets ``batch["returns"]`` ``R`` and the values before this step's updates ``batch["old_values"]`` ``v_old``.
    With ``c = clip`` (None: no clipping)::

        v_c   = v_old + clip(v - v_old, -c, c)
        l     = 1/2 max((v - R)^2, (v_c - R)^2)
        loss  = sum_{b,t} m_bt l_bt / N_tokens

    Metrics: ``loss``, ``clip_fraction`` (share of tokens where the clipped term is the larger), the mean value.
    """

    clip: float | None = 0.2
    group_size: int = 1

    def count(self, batch: ValueBatch) -> float:
        return float(_loss_mask(batch).sum())

    def __call__(
        self, batch: ValueBatch, values: torch.Tensor, normalizer: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        import torch

        check_devices(batch, values)
        mask = _loss_mask(batch)  # [B, T]
        returns, old = batch["returns"].float(), batch["old_values"].float()  # [B, T]
        unclipped = (values - returns).square()  # [B, T]
        if self.clip is None:
            per_token, clipped_more = unclipped, torch.zeros_like(unclipped)
        else:
            clipped = old + (values - old).clamp(-self.clip, self.clip)
            clipped_loss = (clipped - returns).square()
            per_token = torch.maximum(unclipped, clipped_loss)
            clipped_more = (clipped_loss > unclipped).float()
        loss = 0.5 * (per_token * mask).sum() / normalizer
        return loss, {
            "loss": loss.detach(),
            "clip_fraction": (clipped_more * mask).sum() / normalizer,
            "value": (values.detach() * mask).sum() / normalizer,
        }
