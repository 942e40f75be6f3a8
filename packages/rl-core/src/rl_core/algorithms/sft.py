"""SFT: supervised fine-tuning with the NLL of the response tokens.

Rows are ``{prompt, response}`` (or ``messages`` in chat format when the tokenizer has a chat template: the last
assistant message is the response). One step is one optimizer step over ``policy.train_global_batch_size`` rows;
the validation loss is the same NLL over the validation rows, from a forward pass only.
"""

from __future__ import annotations

import attrs

from rl_core.data import EpochSampler, load_split
from rl_core.loops import drive, prefixed
from rl_core.losses import NLLLoss
from rl_core.run import RunContext
from rl_core.supervised import encode_sft, validation_loss

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
    train = load_split(ctx.config.data, "train")
    val = load_split(ctx.config.data, "val")[: cfg.max_val_samples]
    state = ctx.resume()
    rows_per_step = ctx.config.policy.train_global_batch_size
    sampler = EpochSampler(train, rows_per_step, ctx.config.seed, (state or {}).get("data_position", 0))
    loss_fn = NLLLoss()

    def step_fn(_step: int) -> dict[str, float]:
        batch = encode_sft(ctx, sampler.next(), cfg.response_key)
        return prefixed("train", ctx.backend.train(batch, loss_fn))

    return drive(
        ctx,
        total_steps=cfg.max_num_steps,
        state=state,
        step_fn=step_fn,
        validate=(lambda: validation_loss(ctx, encode_sft(ctx, val, cfg.response_key), loss_fn)) if val else None,
        val_period=cfg.val_period,
        val_at_start=cfg.val_at_start,
        save_state=lambda: {"data_position": sampler.position},
    )
