"""Batches: dicts of tensors with a known set of keys, and the helpers that split, pad and pack them.

Every tensor in a batch has the rows as its first dimension. Token tensors are right-padded ``[B, T]``; a
log-probability at position ``t`` is ``log p(x_t | x_<t)`` and position 0 holds 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import torch

Batch = dict[str, "torch.Tensor"]


class TokenBatch(TypedDict):
    """What every training batch has."""

    input_ids: torch.Tensor  # [B, T] long, right-padded
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    loss_mask: torch.Tensor  # [B, T] float, 1 on tokens the loss covers (the response)


class PolicyGradientBatch(TokenBatch, total=False):
    """GRPO / REINFORCE rows: one sampled response each."""

    advantages: torch.Tensor  # [B, T] float (a sequence advantage broadcast over its tokens)
    prev_logprobs: torch.Tensor  # [B, T] the trainer's logprobs before this step's updates
    reference_logprobs: torch.Tensor  # [B, T] the reference (initial) policy's logprobs
    generation_logprobs: torch.Tensor  # [B, T] the rollout engine's logprobs
    sample_mask: torch.Tensor  # [B] float, 0 drops a whole row from the loss


class PreferenceBatch(TokenBatch, total=False):
    """DPO rows: chosen and rejected responses interleaved (rows 2i and 2i+1 are one pair)."""

    reference_logprobs: torch.Tensor  # [B, T]


def num_rows(batch: Batch) -> int:
    return int(batch["input_ids"].shape[0])


def select(batch: Batch, rows: slice | Sequence[int] | torch.Tensor) -> Batch:
    return {key: value[rows] for key, value in batch.items()}


def concat(batches: Sequence[Batch]) -> Batch:
    """Rows of several batches, padding token tensors to the longest."""
    import torch

    width = max(b["input_ids"].shape[1] for b in batches)
    out: Batch = {}
    for key in batches[0]:
        parts = []
        for b in batches:
            value = b[key]
            if value.dim() == 2 and value.shape[1] < width:
                value = torch.nn.functional.pad(value, (0, width - value.shape[1]))
            parts.append(value)
        out[key] = torch.cat(parts)
    return out


def split(batch: Batch, parts: int, group_size: int = 1) -> list[Batch]:
    """``parts`` contiguous, equal chunks (data-parallel shards); groups of ``group_size`` rows stay together."""
    rows = num_rows(batch)
    if rows % (parts * group_size):
        raise ValueError(f"{rows} rows cannot be split into {parts} equal parts of whole groups of {group_size}")
    size = rows // parts
    return [select(batch, slice(i * size, (i + 1) * size)) for i in range(parts)]


def micro_batches(batch: Batch, size: int, group_size: int = 1) -> list[Batch]:
    """Consecutive chunks of ``size`` rows (the last may be shorter), keeping groups whole."""
    if size % group_size:
        raise ValueError(f"micro-batch size {size} must be a multiple of the loss's group size {group_size}")
    rows = num_rows(batch)
    return [select(batch, slice(i, min(i + size, rows))) for i in range(0, rows, size)]


def token_budget_micro_batches(batch: Batch, max_tokens: int, group_size: int = 1) -> list[Batch]:
    """Dynamic micro-batching: consecutive groups of rows whose padded size ``rows x longest`` fits ``max_tokens``
    (a single group larger than the budget becomes its own micro-batch). Each is trimmed to its longest row."""
    lengths = batch["attention_mask"].sum(1).tolist()
    out: list[Batch] = []
    start, longest = 0, 0
    rows = num_rows(batch)
    for group_start in range(0, rows, group_size):
        group_len = max(lengths[group_start : group_start + group_size])
        end = group_start + group_size
        new_longest = max(longest, group_len)
        if group_start > start and new_longest * (end - start) > max_tokens:
            out.append(trim(select(batch, slice(start, group_start))))
            start, new_longest = group_start, group_len
        longest = new_longest
    out.append(trim(select(batch, slice(start, rows))))
    return out


def trim(batch: Batch) -> Batch:
    """Drop padding columns beyond the longest row."""
    width = int(batch["attention_mask"].sum(1).max())
    return {k: (v[:, :width] if v.dim() == 2 else v) for k, v in batch.items()}


def pad_to_multiple(batch: Batch, multiple: int) -> tuple[Batch, int]:
    """Append inert rows (one attended token, no loss) so the row count is a multiple of ``multiple``; returns the
    padded batch and the original row count. Used so every data-parallel rank runs the same number of passes."""
    import torch

    rows = num_rows(batch)
    extra = -rows % multiple
    if not extra:
        return batch, rows
    out: Batch = {}
    for key, value in batch.items():
        filler = torch.zeros((extra, *value.shape[1:]), dtype=value.dtype)
        if key == "attention_mask":
            filler[:, 0] = 1
        out[key] = torch.cat([value, filler])
    return out, rows


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists: ``(input_ids [B, T], attention_mask [B, T])``."""
    import torch

    width = width or max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


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


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` log p(x_t | x_<t) from ``logits [B, T, V]``; position 0 holds 0."""
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, T-1]
    return torch.nn.functional.pad(picked, (1, 0))


def token_logprobs_packed(logits: torch.Tensor, ids: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Like ``token_logprobs`` over a packed row ``[1, N]``: the first token of each document gets 0."""
    import torch

    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    keep = torch.ones_like(ids, dtype=logits.dtype if logits.is_floating_point() else torch.float32)
    keep[0, starts] = 0.0
    return token_logprobs(logits, ids) * keep
