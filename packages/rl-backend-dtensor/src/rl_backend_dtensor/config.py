"""``policy.dtensor_cfg``: the DTensor backend's config section (light: attrs only)."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class DTensorConfig:
    """``policy.dtensor_cfg``: the FSDP2 (DTensor) training backend."""

    #: offer this backend for selection (by priority, or by ``policy.backend``).
    enabled: bool = True
    #: recompute activations in the backward pass (less memory, more compute).
    activation_checkpointing: bool = False
    #: pack each micro-batch's sequences into one row with per-document position ids (no padding).
    sequence_packing: bool = False
    #: bf16 compute (autocast; sharded, also bf16 parameter all-gathers) with fp32 master weights and gradient
    #: reduction.
    mixed_precision: bool = False
    #: in training and in the logprob passes (previous and reference policies), run the output layer and
    #: log-softmax only at the positions that carry loss (same values and gradients there; 0 elsewhere; the saving
    #: grows with the vocabulary and the prompt's share of the tokens). Off: logits everywhere, for a custom loss
    #: or algorithm that reads logprobs outside ``loss_mask``.
    logits_at_loss_positions: bool = True
    #: rows that begin alike up to their first loss position (a GRPO group's samples of one prompt, a DPO pair)
    #: run that beginning once per micro-batch: its keys and values are computed once and shared, in training and
    #: in the logprob passes (the same values and gradients; the saving grows with the prompt's share of the
    #: tokens and the rows per prompt). Needs ``logits_at_loss_positions``; not with ``sequence_packing`` or
    #: ``activation_checkpointing``, nor for models with sliding-window layers (the plain path runs there).
    shared_prefix: bool = True
    #: before the first step, compare each shortcut above that the model takes with whole rows on a small
    #: synthetic batch (logprobs and every parameter's gradient) and turn off, with a warning, any that differs
    #: on this model; its figures are the first step's ``train/shortcut/...`` metrics. Off: trust them unchecked.
    check_shortcuts: bool = True
    #: micro-batches by token budget instead of a fixed row count: rows longest first, each micro-batch trimmed to
    #: its longest row, so little padding is computed where lengths vary (the same results up to float rounding).
    dynamic_batching: bool = False
    #: with ``dynamic_batching``: the token budget of one micro-batch (rows packed up to it).
    max_tokens_per_microbatch: int = attrs.field(default=4096, validator=attrs.validators.gt(0))
    #: FSDP2 CPU offload of parameters, gradients and optimizer state (useful on GPU).
    cpu_offload: bool = False
    #: torch threads per rank; unset, the machine's cores divided among the ranks.
    threads_per_worker: int | None = None
    #: compute token logprobs this many positions at a time (float32, recomputed in the backward), never holding
    #: a float32 copy of the whole [rows, tokens, vocabulary] logits; unset, 1024 on GPU and whole rows on CPU.
    logprob_chunk_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0))
    )
