"""Token maths on batches: log-probabilities from logits, sequence packing, and rows cut into shared prefixes.

A log-probability at position ``t`` is ``log p(x_t | x_<t)`` and position 0 holds 0; rows are right-padded
(``rl_core.contracts.batch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from rl_core.contracts.batch import pad_rows

if TYPE_CHECKING:
    import torch


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Sequence packing: the real tokens of all rows in one row ``[1, N]`` with per-document ``position_ids``,
    and each row's length (to unpack with ``unpack``)."""
    import torch

    lengths = attention_mask.sum(1).tolist()
    ids = torch.cat([input_ids[i, :n] for i, n in enumerate(lengths)]).unsqueeze(0)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return ids, pos, lengths


def unpack(values: torch.Tensor, lengths: Sequence[int], width: int) -> torch.Tensor:
    """Inverse of ``pack`` for a ``[1, N]`` per-token tensor: ``[B, width]``, zero-padded."""

    out = values.new_zeros((len(lengths), width))
    offset = 0
    for i, n in enumerate(lengths):
        out[i, :n] = values[0, offset : offset + n]
        offset += n
    return out


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, chunk_tokens: int | None = None) -> torch.Tensor:
    """``[B, T]`` log p(x_t | x_<t) from ``logits [B, T, V]``; position 0 holds 0 (``picked_logprobs`` with the
    targets one position on)."""
    import torch

    return torch.nn.functional.pad(picked_logprobs(logits[:, :-1], input_ids[:, 1:], chunk_tokens), (1, 0))


def picked_logprobs(logits: torch.Tensor, targets: torch.Tensor, chunk_tokens: int | None = None) -> torch.Tensor:
    """``[B, K]`` log-softmax of ``logits [B, K, V]`` at ``targets [B, K]``, in float32.

    With ``chunk_tokens``, each row is done ``chunk_tokens`` positions at a time under activation checkpointing,
    so that neither a float32 copy of the whole ``[B, K, V]`` logits nor the softmax of it is ever held (for a
    150k vocabulary, 16 x 1024 tokens: 10 GB each); values and gradients are the same."""
    import torch

    if chunk_tokens is None:
        return _chunk_logprobs(logits, targets)
    from torch.utils.checkpoint import checkpoint

    rows = []
    for b in range(logits.shape[0]):
        parts = [
            checkpoint(
                _chunk_logprobs,
                logits[b, s : s + chunk_tokens],
                targets[b, s : s + chunk_tokens],
                use_reentrant=False,
            )
            for s in range(0, logits.shape[1], chunk_tokens)
        ]
        rows.append(torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float32))
    return torch.stack(rows)  # [B, K]


def _chunk_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` log-probabilities of ``targets [..., n]`` under ``logits [..., n, V]``, in float32."""
    import torch

    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def document_interiors(lengths: Sequence[int]) -> torch.Tensor:
    """``[1, N]`` float over a packed row of documents of ``lengths``: 0 at each document's first token, else 1
    (the tokens a packed forward pass predicts from their own document)."""
    import torch

    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    keep = torch.ones((1, sum(lengths)), dtype=torch.float32)
    keep[0, starts] = 0.0
    return keep


@attrs.frozen(kw_only=True)
class SharedPrefixes:
    """Rows cut where their loss begins, each distinct beginning kept once (``split_shared_prefixes``).

    A row ``r`` is its prefix ``prefix_ids[row_prefix[r]]`` (the tokens before the position that predicts its
    first loss token: a GRPO group's prompt, a DPO pair's) followed by its suffix, the row's columns
    ``suffix_index[r]`` from that position on."""

    prefix_ids: torch.Tensor  # [U, P] long, the distinct prefixes, right-padded
    prefix_mask: torch.Tensor  # [U, P] long, 1 on their real tokens
    row_prefix: torch.Tensor  # [B] long, the prefix each row begins with
    suffix_index: torch.Tensor  # [B, S] long, the row's column of each suffix position (clamped past its end)
    suffix_mask: torch.Tensor  # [B, S] long, 1 on real suffix tokens


def split_shared_prefixes(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, need: torch.Tensor
) -> SharedPrefixes | None:
    """Rows ``[B, T]`` as distinct prefixes and per-row suffixes, where ``need [B, T]`` marks the tokens whose
    logprob is wanted: a row's prefix ends before the position that predicts its first wanted token (a row without
    one keeps its last token as its suffix). None when there is nothing to share: no two rows begin with the same
    prefix, or some row's prefix is empty."""
    import torch

    device = input_ids.device
    input_ids, attention_mask, need = input_ids.cpu(), attention_mask.cpu(), need.cpu()  # one copy, read here
    lengths = attention_mask.sum(1).tolist()
    wanted = need > 0
    firsts = wanted.float().argmax(1).tolist()
    starts = [int(f) - 1 if bool(wanted[r].any()) else lengths[r] - 1 for r, f in enumerate(firsts)]
    if min(starts) < 1:
        return None
    distinct: dict[tuple[int, ...], int] = {}
    row_prefix = [distinct.setdefault(tuple(input_ids[r, :s].tolist()), len(distinct)) for r, s in enumerate(starts)]
    if len(distinct) == len(starts):
        return None
    prefix_ids, prefix_mask = pad_rows(list(distinct), 0)
    width = input_ids.shape[1]
    span = max(n - s for n, s in zip(lengths, starts, strict=True))
    columns = torch.tensor(starts)[:, None] + torch.arange(span)  # [B, S]
    inside = columns < torch.tensor(lengths)[:, None]
    return SharedPrefixes(
        prefix_ids=prefix_ids.to(device),
        prefix_mask=prefix_mask.to(device),
        row_prefix=torch.tensor(row_prefix, device=device),
        suffix_index=columns.clamp(max=width - 1).to(device),
        suffix_mask=inside.long().to(device),
    )
