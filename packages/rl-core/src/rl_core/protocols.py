"""The contracts between the core and its plugins (DESIGN.md section 4).

Protocols, not base classes: a plugin implements the methods; nothing is inherited across packages.
Batches are dicts of tensors (``rl_core.batch``); records are frozen attrs classes defined here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    import torch

    from rl_core.batch import Batch

FinishReason = Literal["stop", "length"]


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How to sample: ``n`` samples per prompt, each up to ``max_new_tokens`` tokens."""

    n: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    max_new_tokens: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    temperature: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    top_p: float = attrs.field(default=1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)])
    top_k: int = -1
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@attrs.frozen(kw_only=True)
class Rollout:
    """One sampled response to one prompt."""

    prompt_index: int
    sample_index: int
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    #: log-probability of each sampled token under the engine's weights, one per ``token_ids`` entry.
    logprobs: tuple[float, ...]
    finish_reason: FinishReason


@attrs.frozen(kw_only=True)
class RefitRoute:
    """The route of one refit, chosen by the weight transport (``rl_core.weights`` implements each):
    ``object_store`` (Ray shared memory), ``cuda_ipc`` (same GPU), ``broadcast`` (a process group from the
    trainer's rank 0 to every engine process: NCCL on GPU, gloo on CPU)."""

    kind: Literal["object_store", "cuda_ipc", "broadcast"] = "object_store"
    #: the host (IP) of every engine process that receives (``RolloutEngine.weight_receivers()``): a broadcast's
    #: group size; when all share the sender's host, ``object_store`` copies into host shared memory instead.
    receivers: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class RefitStats:
    """What a weight refit moved and how long it took."""

    num_bytes: int
    num_tensors: int
    seconds: float


class LossFunction(Protocol):
    """A pure loss: ``loss_fn(batch, logprobs, normalizer) -> (loss, metrics)``.

    ``logprobs [B, T]`` are the current policy's log-probabilities of ``batch["input_ids"]`` (position ``t`` holds
    ``log p(x_t | x_<t)``, position 0 is 0). The loss is a *sum* over the rows given divided by ``normalizer``,
    the global count (``count``) over the whole optimizer-step batch across all ranks and micro-batches, so that
    summing the losses (and metrics) of all micro-batches gives the global mean whatever the split.
    """

    def __call__(
        self, batch: Batch, logprobs: torch.Tensor, normalizer: float
    ) -> tuple[torch.Tensor, dict[str, float]]: ...

    def count(self, batch: Batch) -> float:
        """This batch's contribution to the normaliser (valid tokens, sequences or pairs)."""
        ...

    #: rows that must stay together when a batch is split (2 for DPO's chosen/rejected pairs).
    group_size: int


@runtime_checkable
class TrainingBackend(Protocol):
    """A group of policy workers over a Hugging Face checkpoint."""

    def train(self, batch: Batch, loss_fn: LossFunction) -> dict[str, float]:
        """One or more optimizer steps (one per ``policy.train_global_batch_size`` rows); returns metrics."""
        ...

    def logprobs(self, batch: Batch) -> torch.Tensor:
        """``[B, T]`` log-probabilities of ``batch["input_ids"]`` under the current policy."""
        ...

    def reference_logprobs(self, batch: Batch) -> torch.Tensor:
        """``[B, T]`` log-probabilities under the frozen reference (initial) policy."""
        ...

    def save_checkpoint(self, path: Path) -> None: ...

    def load_checkpoint(self, path: Path) -> None: ...

    def export_hf(self, path: Path) -> None:
        """Write a Hugging Face folder (safetensors, config, tokenizer) loadable by ``from_pretrained``."""
        ...

    def weights_for_refit(self, route: RefitRoute) -> Sequence[Any]:
        """Handles to the full weights in Hugging Face naming, in the form ``route`` moves
        (``rl_core.weights.RefitSender.publish`` makes each)."""
        ...

    def offload(self) -> None: ...

    def onload(self) -> None: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Generation over one or more engine replicas."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Rollout]:
        """``n`` rollouts per prompt, ordered by (prompt_index, sample_index)."""
        ...

    def stream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> AsyncIterator[Rollout]:
        """The same rollouts, yielded as each one finishes."""
        ...

    def update_weights(self, handles: Sequence[Any]) -> RefitStats:
        """Replace the engine's weights in place with those behind ``handles`` (any route's)."""
        ...

    def weight_receivers(self) -> Sequence[str]:
        """The host (IP) of each process that holds a copy of the weights (replicas x tensor-parallel ranks)."""
        ...

    def sleep(self) -> None:
        """Free device memory (weights, KV cache) while the trainer runs on the same devices."""
        ...

    def wake(self) -> None:
        """Take the memory back before a refit or generation."""
        ...

    def shutdown(self) -> None: ...


class WeightTransport(Protocol):
    """Moves weights from a backend to an engine (``refit``), whatever the route."""

    def refit(self, backend: TrainingBackend, engine: RolloutEngine) -> RefitStats: ...


Reward = float | Mapping[str, float]


@runtime_checkable
class RewardSource(Protocol):
    """Scores responses: one float, or a dict of named floats, per response, in order."""

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> list[Reward]: ...

    def close(self) -> None: ...


class MetricsLogger(Protocol):
    """Receives one dict of metrics per step."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...
