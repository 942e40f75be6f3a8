"""DPO: direct preference optimisation on ``{prompt, chosen, rejected}`` rows.

Each row becomes two token rows (chosen, then rejected) that stay together through every split. The reference
policy's sequence logprobs are computed once per batch by the backend (skipped when ``reference_free``); the loss
is ``rl_core.training.losses.DPOLoss``. Validation reports the same loss and the preference accuracy.
"""

from __future__ import annotations

import attrs

from rl_core.contracts.batch import PreferenceBatch
from rl_core.data.prompts import Example
from rl_core.training.context import RunContext
from rl_core.training.losses import DPOLoss
from rl_core.training.supervised import SupervisedLoopConfig, encode_pairs, run_supervised


@attrs.frozen(kw_only=True)
class DPOConfig(SupervisedLoopConfig):
    #: DPO's beta: how far from the reference the implicit reward lets the policy move (larger: closer).
    beta: float = attrs.field(default=0.1, validator=attrs.validators.gt(0.0))
    #: no reference policy (its log-probabilities taken as 0).
    reference_free: bool = False
    #: weight of an NLL term on the chosen response, added to the DPO loss.
    sft_loss_weight: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    #: a sequence's log-probability as the mean over its tokens instead of the sum.
    average_log_probs: bool = False


def run(ctx: RunContext) -> dict[str, float]:
    cfg: DPOConfig = ctx.config.section("dpo")
    loss_fn = DPOLoss(
        beta=cfg.beta,
        reference_free=cfg.reference_free,
        sft_loss_weight=cfg.sft_loss_weight,
        average_log_probs=cfg.average_log_probs,
    )

    def pairs(rows: list[Example]) -> PreferenceBatch:
        batch = encode_pairs(ctx, rows)
        if not cfg.reference_free:
            batch["reference_logprobs"] = ctx.backend.reference_logprobs(batch)
        return batch

    return run_supervised(
        ctx, cfg, rows_per_step=ctx.config.policy.train_global_batch_size // 2, encode=pairs, loss_fn=loss_fn
    )
