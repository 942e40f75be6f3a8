"""What a worker actor implements: the contracts between the driver side the core provides (``GroupBackend``,
``GroupEngine`` in ``rl_core.distributed.driver``) and the one class a backend or engine plugin writes. Each method
is called on the actor through Ray; arguments and results travel as plain data (batches of tensors, dicts, tuples).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from rl_core.contracts.batch import Batch
    from rl_core.contracts.protocols import LossFunction
    from rl_core.contracts.refit import RefitPayload, RefitRoute

#: one finished response, as a replica returns it: ``(prompt_index, sample_index, token_ids, text, logprobs,
#: finish_reason)``.
Sample = tuple[int, int, list[int], str, list[float], str]


@runtime_checkable
class RankWorker(Protocol):
    """One rank of a training backend (``start_ranks`` builds it with ``rank``, ``world_size``, ``model_path``,
    ``policy``, ``seed``, ``device`` and the plugin's own arguments). Worker ``i`` holds data-parallel shard
    ``dp_rank[i]``; ``reports[i]`` says whether its results count (one rank per data-parallel group: with tensor or
    pipeline parallelism the others hold the same rows)."""

    def address(self) -> tuple[str, int]:
        """Rank 0's host and a free port, for torch.distributed's rendezvous."""
        ...

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the process group and build the model and optimizer; what the rank is (ranks, host)."""
        ...

    def train(self, shard: Batch, loss_fn: LossFunction[Any], normalizer: float) -> dict[str, float]:
        """One optimizer step over this rank's shard (the loss summed, divided by ``normalizer``); its metrics."""
        ...

    def logprobs(self, shard: Batch, reference: bool = False) -> torch.Tensor | None:
        """[rows, T] logprobs of the shard's tokens (the reference policy's with ``reference``); None on ranks that
        do not report."""
        ...

    def weights_for_refit(self, route: RefitRoute) -> RefitPayload | None:
        """The full weights published for ``route`` (``RefitSender``); None except on rank 0."""
        ...

    def save_checkpoint(self, path: str) -> None:
        """Weights, optimizer and scheduler into the folder ``path`` (created by the driver), bit-exact."""
        ...

    def load_checkpoint(self, path: str) -> None: ...

    def export_hf(self, path: str) -> None:
        """A Hugging Face model folder at ``path`` (rank 0 writes it)."""
        ...

    def offload(self) -> None:
        """Free the accelerator's memory for a colocated engine (weights and optimizer to the host)."""
        ...

    def onload(self) -> None: ...


@runtime_checkable
class ReplicaWorker(Protocol):
    """One replica of a rollout engine (``GroupEngine`` spreads prompts over the replicas)."""

    def generate(self, indices: Sequence[int], prompts: Sequence[list[int]], sampling: dict[str, Any]) -> list[Sample]:
        """``sampling.n`` responses for each prompt (``sampling``: ``SamplingParams``' fields); ``indices`` are the
        prompts' indices in the whole request."""
        ...

    def stream(
        self, indices: Sequence[int], prompts: Sequence[list[int]], sampling: dict[str, Any]
    ) -> Iterator[Sample]:
        """The same samples as ``generate``, each as soon as it finishes."""
        ...

    def update_weights(self, payload: RefitPayload, rank_offset: int) -> list[tuple[Any, ...]]:
        """Load the weights behind ``payload`` in place; ``received_stats(...)`` for each engine process."""
        ...

    def sleep(self) -> None:
        """Release the accelerator's memory (weights and KV cache) for a colocated trainer."""
        ...

    def wake(self) -> None: ...


@runtime_checkable
class AsyncReplicaWorker(Protocol):
    """A replica as a Ray async actor (its methods coroutines, ``stream`` an async generator): the same contract as
    ``ReplicaWorker``, for engines whose requests run concurrently inside one replica."""

    async def generate(
        self, indices: Sequence[int], prompts: Sequence[list[int]], sampling: dict[str, Any]
    ) -> list[Sample]: ...

    def stream(
        self, indices: Sequence[int], prompts: Sequence[list[int]], sampling: dict[str, Any]
    ) -> AsyncIterator[Sample]: ...

    async def update_weights(self, payload: RefitPayload, rank_offset: int) -> list[tuple[Any, ...]]: ...

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...
