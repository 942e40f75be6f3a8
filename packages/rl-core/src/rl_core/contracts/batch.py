"""Batches: dicts of tensors with a known set of keys, and the helpers that split, pad and pack them.

Every tensor in a batch has the rows as its first dimension. Token tensors are right-padded ``[B, T]``; a
log-probability at position ``t`` is ``log p(x_t | x_<t)`` and position 0 holds 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast

import attrs

if TYPE_CHECKING:
    import torch

#: a batch whose keys are not tracked (inside backends and workers, which move any batch they are given).
Batch = dict[str, "torch.Tensor"]
#: any batch: a ``Batch`` or one of the ``TypedDict``s below; the helpers return the kind they are given.
BatchT = TypeVar("BatchT", bound=Mapping[str, Any])


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


class ScoredPairBatch(TokenBatch, total=False):
    """Reward-model rows: chosen and rejected interleaved (rows 2i and 2i+1), ``loss_mask`` at the token the score
    is read at."""

    margin: torch.Tensor  # [B] the pair's margin, on both its rows


class ValueBatch(TokenBatch, total=False):
    """A critic's rows (PPO): ``loss_mask`` at the positions whose value is a state's, with their targets."""

    returns: torch.Tensor  # [B, T] the value targets
    old_values: torch.Tensor  # [B, T] the critic's values before this step's updates


#: a batch a training backend trains on: a ``TokenBatch`` or one that extends it.
TokenBatchT = TypeVar("TokenBatchT", bound=TokenBatch)


def to_device(batch: BatchT, device: torch.device | str) -> BatchT:
    """Every tensor of ``batch`` on ``device`` (a worker's micro-batch, before its loss reads it)."""
    return cast(BatchT, {key: value.to(device) for key, value in batch.items()})


def num_rows(batch: Mapping[str, Any]) -> int:
    return int(batch["input_ids"].shape[0])


def select(batch: BatchT, rows: slice | Sequence[int] | torch.Tensor) -> BatchT:
    return cast(BatchT, {key: value[rows] for key, value in batch.items()})


def concat(batches: Sequence[BatchT]) -> BatchT:
    """Rows of several batches, padding token tensors to the longest."""
    import torch

    width = max(b["input_ids"].shape[1] for b in batches)
    out: dict[str, Any] = {}
    for key in batches[0]:
        parts = []
        for b in batches:
            value = b[key]
            if value.dim() == 2 and value.shape[1] < width:
                value = torch.nn.functional.pad(value, (0, width - value.shape[1]))
            parts.append(value)
        out[key] = torch.cat(parts)
    return cast(BatchT, out)


def split(batch: BatchT, parts: int, group_size: int = 1) -> list[BatchT]:
    """``parts`` contiguous, equal chunks (data-parallel shards); groups of ``group_size`` rows stay together."""
    rows = num_rows(batch)
    if rows % (parts * group_size):
        raise ValueError(f"{rows} rows cannot be split into {parts} equal parts of whole groups of {group_size}")
    size = rows // parts
    return [select(batch, slice(i * size, (i + 1) * size)) for i in range(parts)]


def micro_batches(batch: BatchT, size: int, group_size: int = 1) -> list[BatchT]:
    """Consecutive chunks of ``size`` rows (the last may be shorter), keeping groups whole."""
    if size % group_size:
        raise ValueError(f"micro-batch size {size} must be a multiple of the loss's group size {group_size}")
    rows = num_rows(batch)
    return [select(batch, slice(i, min(i + size, rows))) for i in range(0, rows, size)]


def token_budget_micro_batches(batch: BatchT, max_tokens: int, group_size: int = 1) -> list[BatchT]:
    """Dynamic micro-batching: consecutive groups of rows whose padded size ``rows x longest`` fits ``max_tokens``
    (a single group larger than the budget becomes its own micro-batch). Each is trimmed to its longest row."""
    lengths = batch["attention_mask"].sum(1).tolist()
    out: list[BatchT] = []
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


def longest_first(batch: Mapping[str, Any], group_size: int = 1) -> torch.Tensor:
    """``[B]`` row order that puts whole groups of ``group_size`` rows longest first (a stable sort on each group's
    longest row), so that micro-batches of neighbouring rows are of like length and carry little padding."""
    import torch

    lengths = batch["attention_mask"].sum(1).view(-1, group_size).amax(1)  # [B / g]
    groups = torch.sort(lengths, descending=True, stable=True).indices  # [B / g]
    return (groups[:, None] * group_size + torch.arange(group_size)).flatten()  # [B]


def trim(batch: BatchT) -> BatchT:
    """Drop padding columns beyond the longest row."""
    width = int(batch["attention_mask"].sum(1).max())
    return cast(BatchT, {k: (v[:, :width] if v.dim() == 2 else v) for k, v in batch.items()})


def pad_to_multiple(batch: BatchT, multiple: int) -> tuple[BatchT, int]:
    """Append inert rows (one attended token, no loss) so the row count is a multiple of ``multiple``; returns the
    padded batch and the original row count. Used so every data-parallel rank runs the same number of passes."""
    import torch

    rows = num_rows(batch)
    extra = -rows % multiple
    if not extra:
        return batch, rows
    out: dict[str, Any] = {}
    for key, value in batch.items():
        filler = torch.zeros((extra, *value.shape[1:]), dtype=value.dtype)
        if key == "attention_mask":
            filler[:, 0] = 1
        out[key] = torch.cat([value, filler])
    return cast(BatchT, out), rows


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
