"""Reward-model training: Bradley-Terry on ``{prompt, chosen, rejected}`` rows (each may carry a ``margin``).

The model is ``policy.model_name`` with a one-output score head (``policy.head: score``; a causal LM gets a new
head). Each side is encoded as ``rl-reward-server``'s reward-model scorer reads it, ``prompt + separator +
response`` through the tokenizer as it is, and read at its last token, so that the exported ``final/`` (an
``AutoModelForSequenceClassification``), served as it is, gives the rewards it was trained to give. The loss is
``rl_core.training.losses.BradleyTerryLoss``; validation reports it and the accuracy on held-out pairs.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from rl_core.base.errors import InputError
from rl_core.contracts.batch import ScoredPairBatch, pad_rows
from rl_core.data.prompts import Example
from rl_core.training.context import RunContext
from rl_core.training.losses import BradleyTerryLoss
from rl_core.training.supervised import SupervisedLoopConfig, check_length, run_supervised


@attrs.frozen(kw_only=True)
class RewardModelConfig(SupervisedLoopConfig):
    #: text between prompt and response (give the reward server the same ``separator`` when serving).
    separator: str = ""
    #: the margin ``m`` of ``-log sigmoid(r_chosen - r_rejected - m)`` for rows without their own ``margin``.
    margin: float = 0.0


def run(ctx: RunContext) -> dict[str, float]:
    cfg: RewardModelConfig = ctx.config.section("reward_model")
    return run_supervised(
        ctx,
        cfg,
        rows_per_step=ctx.config.policy.train_global_batch_size // 2,
        encode=lambda rows: encode_scored_pairs(ctx, rows, cfg),
        loss_fn=BradleyTerryLoss(),
    )


def encode_scored_pairs(ctx: RunContext, examples: Sequence[Example], cfg: RewardModelConfig) -> ScoredPairBatch:
    """Rows 2i (chosen) and 2i+1 (rejected) with ``loss_mask`` set at each row's last token only (where the score
    is read) and ``margin [B]`` (the pair's, on both of its rows)."""
    import torch

    tok, key = ctx.tokenizer, ctx.config.data.prompt_key
    rows, margins = [], []
    for ex in examples:
        if key not in ex or "chosen" not in ex or "rejected" not in ex:
            raise InputError(f"a preference example needs {key!r}, 'chosen' and 'rejected'; fields are {sorted(ex)}")
        for side in ("chosen", "rejected"):
            rows.append(check_length(ctx, tok(str(ex[key]) + cfg.separator + str(ex[side]))["input_ids"]))
            margins.append(float(ex.get("margin", cfg.margin)))
    ids, attn = pad_rows(rows, tok.pad_token_id)
    loss_mask = torch.zeros(ids.shape, dtype=torch.float32)
    loss_mask[torch.arange(len(rows)), attn.sum(1) - 1] = 1.0
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask, "margin": torch.tensor(margins)}
