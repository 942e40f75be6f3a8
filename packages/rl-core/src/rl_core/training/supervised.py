"""What the supervised loops (SFT, DPO) share: their loop settings, token batches, the loop and the validation loss."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from rl_core.base.errors import InputError
from rl_core.contracts.batch import PreferenceBatch, TokenBatch, TokenBatchT, pad_rows
from rl_core.contracts.protocols import LossFunction
from rl_core.data.prompts import EpochSampler, Example, chat_ids, render_prompt
from rl_core.training.context import Phases, RunContext
from rl_core.training.loops import prefixed, run_loop

_pos = attrs.validators.gt(0)


@attrs.frozen(kw_only=True)
class SupervisedLoopConfig:
    """The loop settings SFT and DPO share (each algorithm's section adds its own)."""

    #: optimizer steps of the run.
    max_num_steps: int = attrs.field(default=100, validator=_pos)
    #: validate (the held-out loss and metrics) every this many steps, and after the last.
    val_period: int = attrs.field(default=10, validator=_pos)
    #: validate before the first step too (step 0).
    val_at_start: bool = True
    #: held-out rows per validation.
    max_val_samples: int = attrs.field(default=64, validator=_pos)


def run_supervised(
    ctx: RunContext,
    cfg: SupervisedLoopConfig,
    *,
    rows_per_step: int,
    encode: Callable[[list[Example]], TokenBatchT],
    loss_fn: LossFunction[TokenBatchT],
) -> dict[str, float]:
    """One optimizer step per ``rows_per_step`` examples, ``encode``d and trained with ``loss_fn`` (timed as
    ``time/train``); validation is the same loss over the validation rows, from a forward pass only."""

    def step(sampler: EpochSampler, _step: int) -> dict[str, float]:
        phases = Phases()
        with phases("train"):
            metrics = prefixed("train", ctx.backend.train(encode(sampler.next()), loss_fn))
        return {**metrics, **phases.metrics()}

    return run_loop(
        ctx,
        rows_per_step=rows_per_step,
        total_steps=cfg.max_num_steps,
        step_fn=step,
        validate=lambda rows, _step: validation_loss(ctx, encode(rows), loss_fn),
        val_period=cfg.val_period,
        val_at_start=cfg.val_at_start,
        max_val_samples=cfg.max_val_samples,
    )


def _prompt_response_ids(ctx: RunContext, ex: Example, response: Any) -> tuple[list[int], list[int]]:
    tok = ctx.tokenizer
    if "messages" in ex and getattr(tok, "chat_template", None):
        messages = list(ex["messages"])
        prompt_ids = chat_ids(tok, messages[:-1], generation_prompt=True)
        full = chat_ids(tok, messages, generation_prompt=False)
        return prompt_ids, full[len(prompt_ids) :]
    key = ctx.config.data.prompt_key
    if key not in ex or response is None:
        raise InputError(f"an example lacks {key!r} or its response: fields are {sorted(ex)}")
    prompt_ids = render_prompt(tok, ctx.config.data, ex[key])[0]
    response_ids = tok(str(response), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return prompt_ids, response_ids


def check_length(ctx: RunContext, ids: list[int]) -> list[int]:
    """``ids``, or an error if the example is longer than ``policy.max_total_sequence_length``."""
    limit = ctx.config.policy.max_total_sequence_length
    if len(ids) > limit:
        raise InputError(
            f"an example has {len(ids)} tokens, more than policy.max_total_sequence_length ({limit}); raise it or "
            "shorten the data"
        )
    return ids


def _encode(ctx: RunContext, pieces: Sequence[tuple[list[int], list[int]]]) -> PreferenceBatch:
    import torch

    rows = [check_length(ctx, prompt + response) for prompt, response in pieces]
    ids, attn = pad_rows(rows, ctx.tokenizer.pad_token_id)
    loss_mask = torch.zeros(ids.shape, dtype=torch.float32)
    for i, (prompt, response) in enumerate(pieces):
        loss_mask[i, len(prompt) : len(prompt) + len(response)] = 1.0
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask}


def encode_sft(ctx: RunContext, examples: Sequence[Example], response_key: str) -> TokenBatch:
    return _encode(ctx, [_prompt_response_ids(ctx, ex, ex.get(response_key)) for ex in examples])


def encode_pairs(ctx: RunContext, examples: Sequence[Example]) -> PreferenceBatch:
    """Chosen and rejected rows interleaved: rows 2i and 2i+1 are pair i."""
    pieces = []
    for ex in examples:
        if "chosen" not in ex or "rejected" not in ex:
            raise InputError(f"a preference example needs 'chosen' and 'rejected'; fields are {sorted(ex)}")
        pieces.append(_prompt_response_ids(ctx, ex, ex["chosen"]))
        pieces.append(_prompt_response_ids(ctx, ex, ex["rejected"]))
    return _encode(ctx, pieces)


def validation_loss(ctx: RunContext, batch: TokenBatchT, loss_fn: LossFunction[TokenBatchT]) -> dict[str, float]:
    """The loss (and its metrics) over ``batch`` from the backend's logprobs, with no update."""
    logprobs = ctx.backend.logprobs(batch)
    _loss, metrics = loss_fn(batch, logprobs, loss_fn.count(batch))
    return {f"val/{k}": float(v) for k, v in metrics.items()}
