"""Batches: dicts of tensors with a known set of keys, their layout rule, and the helpers that split and pad them.

Every tensor in a batch has the rows as its first dimension. Token tensors are right-padded ``[B, T]``; a
log-probability at position ``t`` is ``log p(x_t | x_<t)`` and position 0 holds 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast

from rl_core.base.errors import InputError
from rl_core.base.moved import moved_names

#: moved to ``rl_core.api.tokens`` (the token maths, apart from the batch layout): the old spelling warns until 0.3
__getattr__ = moved_names(
    "rl_core.contracts.batch",
    ["token_logprobs", "picked_logprobs", "pack", "unpack", "document_interiors", "split_shared_prefixes"],
    "rl_core.contracts.tokens",
    shown=("rl_core.api.batch", "rl_core.api.tokens"),
    since="0.1",
    removed_in="0.3",
)

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

#: how to build batches that keep the contract
_PAD_ADVICE = "build rows with rl_core.api.batch.pad_rows (tokens first, then padding)"


def check_layout(batch: Mapping[str, Any]) -> None:
    """The token layout every backend relies on, checked where a batch enters a backend (a third-party algorithm
    builds batches too): ``input_ids``, ``attention_mask`` and ``loss_mask`` of one shape ``[B, T]``; each row's
    tokens first, then its padding (right padding: positions are counted from the row's start; a left-padded row
    would run with shifted positions, and share its padding as prompt); a loss only on tokens. An error names the
    rule and the first row that breaks it."""
    missing = [k for k in ("input_ids", "attention_mask", "loss_mask") if k not in batch]
    if missing:
        raise InputError(f"a batch needs {', '.join(missing)} (keys are {sorted(batch)})")
    shapes = {k: tuple(batch[k].shape) for k in ("input_ids", "attention_mask", "loss_mask")}
    if len(set(shapes.values())) > 1 or len(shapes["input_ids"]) != 2:
        raise InputError(f"input_ids, attention_mask and loss_mask must have one shape [B, T]; they have {shapes}")
    attn = batch["attention_mask"].bool()
    rising = (attn[:, 1:] & ~attn[:, :-1]).any(1)  # a token after padding
    if bool(rising.any()):
        row = int(rising.nonzero()[0])
        raise InputError(
            f"batch row {row} is not right-padded: its attention_mask has a token after padding "
            f"({attn[row].int().tolist()[:24]}...); every row must be its tokens, then padding: {_PAD_ADVICE}"
        )
    outside = (batch["loss_mask"].bool() & ~attn).any(1)
    if bool(outside.any()):
        row = int(outside.nonzero()[0])
        raise InputError(f"batch row {row} has loss_mask set on padding (where attention_mask is 0): {_PAD_ADVICE}")


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
