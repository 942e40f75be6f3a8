"""The contracts between the core and its plugins.

Protocols, not base classes: a plugin implements the methods; nothing is inherited across packages.
Batches are dicts of tensors (``rl_core.contracts.batch``, typed by its ``TypedDict``s); records are frozen attrs classes
defined here and in ``rl_core.contracts.refit`` (the weight routes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

import attrs

if TYPE_CHECKING:
    import torch

    from rl_core.contracts.batch import TokenBatch, TokenBatchT
    from rl_core.contracts.refit import RefitPayload, RefitRoute, RefitStats

#: the batch a loss reads (``TokenBatch``, ``PolicyGradientBatch``, ``PreferenceBatch``, or an untyped ``Batch``).
BatchT_contra = TypeVar("BatchT_contra", contravariant=True)

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
    #: multi-turn episodes: whether each of ``token_ids`` was sampled by the model (True) or is the environment's
    #: (False, with logprob 0, and no loss); None: every token was sampled.
    sampled: tuple[bool, ...] | None = None


class LossFunction(Protocol[BatchT_contra]):
    """A pure loss: ``loss_fn(batch, logprobs, normalizer) -> (loss, metrics)``.

    ``logprobs [B, T]`` are the current policy's log-probabilities of ``batch["input_ids"]`` (position ``t`` holds
    ``log p(x_t | x_<t)``, position 0 is 0) wherever ``loss_mask`` is set; elsewhere a backend may leave them at 0
    (it need not compute logits where no loss is taken), so a loss reads them only under the mask. The loss is a
    *sum* over the rows given divided by ``normalizer``, the global count (``count``) over the whole optimizer-step
    batch across all ranks and micro-batches, so that summing the losses (and metrics) of all micro-batches gives
    the global mean whatever the split. Every tensor of ``batch`` must be on the device of ``logprobs``. With
    ``policy.head=score`` the backend's per-token output is the score head's value instead (a reward model's or a
    critic's), under the same rules.
    """

    def __call__(
        self, batch: BatchT_contra, logprobs: torch.Tensor, normalizer: float, /
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...

    def count(self, batch: BatchT_contra) -> float:
        """This batch's contribution to the normaliser (valid tokens, sequences or pairs)."""
        ...

    @property
    def group_size(self) -> int:
        """Rows that must stay together when a batch is split (2 for DPO's chosen/rejected pairs)."""
        ...


@runtime_checkable
class TrainingBackend(Protocol):
    """A group of policy workers over a Hugging Face checkpoint."""

    def train(self, batch: TokenBatchT, loss_fn: LossFunction[TokenBatchT]) -> dict[str, float]:
        """One or more optimizer steps (one per ``policy.train_global_batch_size`` rows); returns metrics (the
        loss's metrics summed over micro-batches and ranks, averaged over optimizer steps; ``grad_norm``, ``lr``).
        ``batch`` is a ``TokenBatch`` plus what the loss reads (``PolicyGradientBatch``, ``PreferenceBatch``)."""
        ...

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, T]`` log-probabilities of ``batch["input_ids"]`` under the current policy where
        ``batch["loss_mask"]`` is set; 0 on padding and at position 0, and elsewhere either the logprob or 0 (the
        core reads them only under ``loss_mask``, as a loss does, so a backend may skip the logits there)."""
        ...

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, T]`` log-probabilities under the frozen reference (initial) policy, as ``logprobs`` gives them."""
        ...

    def save_checkpoint(self, path: Path) -> None: ...

    def load_checkpoint(self, path: Path) -> None: ...

    def export_hf(self, path: Path) -> None:
        """Write a Hugging Face folder (safetensors, config, tokenizer) loadable by ``from_pretrained``."""
        ...

    def weights_for_refit(self, route: RefitRoute) -> RefitPayload:
        """The full weights in Hugging Face names as one payload: rank 0's ``RefitSender.publish(full, route)``
        (every rank takes part in gathering them)."""
        ...

    def offload(self) -> None:
        """Free device memory for a colocated engine: release the last refit (``RefitSender.release``), move
        parameters and optimizer state to CPU. A no-op on CPU."""
        ...

    def onload(self) -> None:
        """Take the device memory back before training."""
        ...

    def shutdown(self) -> None: ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Generation over one or more engine replicas.

    An engine whose replicas serve overlapping calls together (continuous batching across calls, as vLLM's async
    engine) may say so with an attribute ``concurrent_requests = True``; multi-turn episodes then stream, each
    episode's next turn its own call (``environment.schedule: auto``). Without it, calls are assumed to queue.
    An engine whose model carries the run's LoRA adapters (``policy.lora``) says so with ``takes_adapters = True``:
    its refits then hold only the adapters' tensors (``peft`` names); otherwise they hold whole, merged weights."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Rollout]:
        """``n`` rollouts per prompt, ordered by (prompt_index, sample_index). Empty ``prompts``, an empty prompt
        or one longer than the engine's context is an ``InputError``.

        ``Rollout.logprobs`` are the log-probabilities of the sampled tokens under the engine's weights at
        temperature 1 (the policy itself: logits not divided by the temperature, not renormalised after top-p /
        top-k), so that they compare with the trainer's. ``finish_reason`` is ``"length"`` exactly when the
        response used all of ``max_new_tokens`` without reaching a stop token or string."""
        ...

    def stream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> AsyncIterator[Rollout]:
        """The same rollouts as ``generate`` (same seed, same samples), yielded as each one finishes."""
        ...

    def update_weights(self, payload: RefitPayload) -> RefitStats:
        """Replace the weights of every engine process in place with those behind ``payload`` (any route's; read it
        with ``rl_core.contracts.refit.receive_weights``) and return what was loaded, with the received tensors' checksums
        when the payload carries the sender's."""
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


@attrs.frozen(kw_only=True)
class Transition:
    """What an environment answers to one model turn."""

    #: text appended after the model's turn (a tool's output, a user's reply); "" for none.
    observation: str
    #: this turn's contribution to the episode's reward.
    reward: float = 0.0
    done: bool = False
    #: the episode's state for the next step (whatever the environment keeps; it must pickle).
    state: Any = None


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment, stateless between calls: the episode's state travels with it, so that steps can
    run in any process."""

    def reset(self, row: Mapping[str, Any]) -> tuple[str, Any]:
        """Start an episode from a dataset row: (the prompt's text, the episode's state)."""
        ...

    def step(self, state: Any, action: str) -> Transition:
        """The environment's answer to the model's turn ``action`` (its text, as sampled, stop string included)."""
        ...

    def close(self) -> None: ...


@attrs.frozen(kw_only=True)
class DrivenEpisodes:
    """What an ``EpisodeDriver`` returns for ``params.n`` episodes of each example, ordered by (example, episode)."""

    #: each episode's last sample (``Rollout.sampled`` marks the model's tokens).
    rollouts: list[Rollout]
    #: each episode's reward (the run's reward sources, if any, are added on the last sample's text).
    rewards: list[float]
    metrics: dict[str, float]
    #: each episode as RUN_DIR/samples.jsonl keeps it: ``prompt``, ``turns``, ``reward``, ``ended``.
    transcripts: list[dict[str, Any]]
    #: ``(episode, sample)``: the samples an episode split off before its last one (its history edited), each
    #: trained with the episode's advantage.
    earlier: list[tuple[int, Rollout]] = attrs.Factory(list)
    #: per episode, False where it is dropped from the loss (an agent that failed, with ``on_error: drop``).
    keep: list[bool] | None = None


@runtime_checkable
class EpisodeDriver(Protocol):
    """An environment that drives the engine itself instead of answering turns: an agent program calling the
    model through an endpoint, say. An ``EnvironmentSpec``'s factory may return one instead of an
    ``Environment``; the run then asks it for each step's episodes."""

    def run(self, host: Any, examples: Sequence[Mapping[str, Any]], params: SamplingParams) -> DrivenEpisodes:
        """``params.n`` episodes per example on ``host.engine`` (``host``: the run's engine, tokenizer, config
        and ``refits``), sampled with ``params`` unless an episode's request says otherwise."""
        ...

    def close(self) -> None: ...


Reward = float | Mapping[str, float]


@runtime_checkable
class RewardSource(Protocol):
    """Scores responses: one float, or a dict of named floats, per response, in order."""

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> Sequence[Reward]: ...

    def close(self) -> None: ...


class MetricsLogger(Protocol):
    """Receives one dict of metrics per step."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...
