"""SFT: supervised fine-tuning with the NLL of the response tokens.

Rows are ``{prompt, response}`` (or ``messages`` in chat format when the tokenizer has a chat template: the last
assistant message is the response). One step is one optimizer step over ``policy.train_global_batch_size`` rows;
the validation loss is the same NLL over the validation rows, from a forward pass only.
"""

from __future__ import annotations

import attrs

from rl_core.training.context import RunContext
from rl_core.training.loops import prefixed, run_loop
from rl_core.training.losses import NLLLoss
from rl_core.training.supervised import encode_sft, validation_loss

_pos = attrs.validators.gt(0)


@attrs.frozen(kw_only=True)
class SFTConfig:
    max_num_steps: int = attrs.field(default=100, validator=_pos)
    val_period: int = attrs.field(default=10, validator=_pos)
    val_at_start: bool = True
    max_val_samples: int = attrs.field(default=64, validator=_pos)
    response_key: str = "response"


def run(ctx: RunContext) -> dict[str, float]:
    cfg: SFTConfig = ctx.config.section("sft")
    loss_fn = NLLLoss()
    return run_loop(
        ctx,
        rows_per_step=ctx.config.policy.train_global_batch_size,
        total_steps=cfg.max_num_steps,
        step_fn=lambda sampler, _step: prefixed(
            "train", ctx.backend.train(encode_sft(ctx, sampler.next(), cfg.response_key), loss_fn)
        ),
        validate=lambda rows: validation_loss(ctx, encode_sft(ctx, rows, cfg.response_key), loss_fn),
        val_period=cfg.val_period,
        val_at_start=cfg.val_at_start,
        max_val_samples=cfg.max_val_samples,
    )
