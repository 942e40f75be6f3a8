"""SFT: supervised fine-tuning with the NLL of the response tokens.

Rows are ``{prompt, response}`` (or ``messages`` in chat format when the tokenizer has a chat template: the last
assistant message is the response). One step is one optimizer step over ``policy.train_global_batch_size`` rows;
the validation loss is the same NLL over the validation rows, from a forward pass only.
"""

from __future__ import annotations

import attrs

from rl_core.training.context import RunContext
from rl_core.training.losses import NLLLoss
from rl_core.training.supervised import SupervisedLoopConfig, encode_sft, run_supervised


@attrs.frozen(kw_only=True)
class SFTConfig(SupervisedLoopConfig):
    #: the field of a data row holding the target response (the loss is on its tokens).
    response_key: str = "response"


def run(ctx: RunContext) -> dict[str, float]:
    cfg: SFTConfig = ctx.config.section("sft")
    return run_supervised(
        ctx,
        cfg,
        rows_per_step=ctx.config.policy.train_global_batch_size,
        encode=lambda rows: encode_sft(ctx, rows, cfg.response_key),
        loss_fn=NLLLoss(),
    )
