"""The driver side that plugins share: ``GroupBackend`` implements ``TrainingBackend`` over a ``WorkerGroup`` of
rank workers, and ``GroupEngine`` implements ``RolloutEngine`` over a ``WorkerGroup`` of engine replicas, so a
backend or engine plugin writes only its worker (and how to start it). What a worker implements is typed in
``rl_core.contracts.workers`` (``RankWorker``, ``ReplicaWorker``; exported by ``rl_core.api``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from rl_core.base.errors import InputError
from rl_core.base.schema import Config, PolicyConfig
from rl_core.contracts import batch as B
from rl_core.contracts.batch import BatchT, TokenBatch, TokenBatchT
from rl_core.contracts.protocols import Rollout, SamplingParams
from rl_core.contracts.refit import RefitPayload, RefitRoute, RefitStats, replicas_stats
from rl_core.contracts.workers import AsyncReplicaWorker, RankWorker, ReplicaWorker, Sample
from rl_core.distributed.cluster import WorkerGroup
from rl_core.distributed.placement import detected_device, engine_layout, policy_layout

if TYPE_CHECKING:
    import torch

    from rl_core.contracts.protocols import LossFunction
    from rl_core.distributed.cluster import WorkerGroup


def peak_memory(_worker: Any = None) -> tuple[str, float]:
    """The calling process's peak memory so far, in GiB: ``("cuda", allocated)`` where it trains on a GPU, else
    ``("host", resident set)``."""
    import resource

    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return "cuda", torch.cuda.max_memory_allocated() / 2**30
    return "host", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def start_replicas(
    worker_cls: type[ReplicaWorker] | type[AsyncReplicaWorker],
    config: Config,
    args: Callable[[int], Mapping[str, Any]],
    *,
    processes_per_replica: int = 1,
    env_vars: Mapping[str, str] | None = None,
) -> WorkerGroup:
    """An engine's replicas: a ``worker_cls`` actor per replica (placed by ``engine_layout``), each built with
    ``model_path``, ``replicas``, ``dtype`` and ``args(rank)``; its output in the run folder's logs."""
    return WorkerGroup(
        worker_cls,
        engine_layout(config, detected_device(config), processes_per_replica),
        lambda rank: dict(
            model_path=config.policy.model_name,
            replicas=config.policy.generation.num_replicas,
            dtype=config.policy.precision,
            **args(rank),
        ),
        name="rollout",
        placement=config.cluster.placement,
        env_vars=env_vars,
        required_paths=[config.policy.model_name],
        log_dir=Path(config.run_dir).resolve() / "logs",
    )


def start_ranks(
    worker_cls: type[RankWorker], config: Config, args: Mapping[str, Any], *, required_paths: Sequence[str]
) -> tuple[WorkerGroup, list[Any]]:
    """The policy's ranks: a ``worker_cls`` actor per rank (placed by ``policy_layout``), each built with
    ``rank``, ``world_size``, ``model_path``, ``policy``, ``seed``, ``device`` and ``args``; then torch.distributed
    set up through rank 0's ``address() -> (host, port)`` and every rank's ``setup(host, port)``. Returns the
    group and each rank's ``setup`` answer; nothing is left running if any of it fails."""

    policy, device = config.policy, detected_device(config)
    group = WorkerGroup(
        worker_cls,
        policy_layout(config, device),
        lambda rank: dict(
            rank=rank,
            world_size=policy.num_workers,
            model_path=policy.model_name,
            policy=policy,
            seed=config.seed,
            device=device,
            **args,
        ),
        name="policy" if policy.head == "lm" else "value",  # the log files' names: a critic's beside the policy's
        placement=config.cluster.placement,
        required_paths=required_paths,
        log_dir=Path(config.run_dir).resolve() / "logs",
    )
    try:
        master = group.get([group.actors[0].address.remote()])[0]
        return group, group.call("setup", *master)
    except BaseException:
        group.shutdown()
        raise


class GroupBackend:
    """``rl_core.contracts.protocols.TrainingBackend`` over the ranks of ``group``.

    ``check_checkpoint(path)`` returns why ``path`` is not this backend's checkpoint (None when it is);
    ``startup_metrics`` (a start-up check's figures) join the metrics of the first ``train``."""

    def __init__(
        self,
        group: WorkerGroup,
        policy: PolicyConfig,
        *,
        dp_rank: Sequence[int] | None = None,
        reports: Sequence[bool] | None = None,
        check_checkpoint: Callable[[Path], str | None] = lambda _path: None,
        startup_metrics: Mapping[str, float] | None = None,
    ) -> None:
        size = len(group.actors)
        self.group, self.policy = group, policy
        self.dp_rank = list(dp_rank) if dp_rank is not None else list(range(size))
        self.reports = list(reports) if reports is not None else [True] * size
        self.dp = max(self.dp_rank) + 1
        self.check_checkpoint = check_checkpoint
        self.startup_metrics = dict(startup_metrics or {})

    # -- batches --------------------------------------------------------------------------------------------------

    def _check(self, batch: Mapping[str, Any]) -> None:
        B.check_layout(batch)
        width = batch["input_ids"].shape[1]
        if width > self.policy.max_total_sequence_length:
            raise InputError(
                f"a batch has sequences of {width} tokens, more than policy.max_total_sequence_length "
                f"({self.policy.max_total_sequence_length}); raise it or shorten the data"
            )
        if B.num_rows(batch) == 0:
            raise InputError("the batch is empty")

    def _per_worker(self, batch: BatchT, group_size: int) -> tuple[list[BatchT], int]:
        """Each worker's shard (its data-parallel rank's), padded with inert rows so every rank runs the same
        passes; and the original row count."""
        padded, rows = B.pad_to_multiple(batch, self.dp * group_size)
        shards = B.split(padded, self.dp, group_size)
        return [shards[d] for d in self.dp_rank], rows

    def _reported(self, results: Sequence[Any]) -> list[Any]:
        return [r for r, reports in zip(results, self.reports, strict=True) if reports]

    def train(self, batch: TokenBatchT, loss_fn: LossFunction[TokenBatchT]) -> dict[str, float]:
        """One optimizer step per ``policy.train_global_batch_size`` rows; the loss's metrics summed over the ranks
        (each is a share of the global value), ``grad_norm`` and ``lr`` from rank 0, averaged over the steps;
        ``peak_memory_gib``: the ranks' peak memory so far (``peak_memory``: summed on the host, the largest GPU's)."""
        self._check(batch)
        steps: list[dict[str, float]] = []
        for chunk in B.micro_batches(batch, self.policy.train_global_batch_size, loss_fn.group_size):
            normalizer = max(loss_fn.count(chunk), 1e-8)
            shards, _rows = self._per_worker(chunk, loss_fn.group_size)
            results = self.group.call_each("train", [(s, loss_fn, normalizer) for s in shards])
            shares = self._reported(results)
            merged = {k: sum(r[k] for r in shares) for k in shares[0] if k not in ("grad_norm", "lr")}
            merged.update(grad_norm=results[0]["grad_norm"], lr=results[0]["lr"])
            steps.append(merged)
        startup, self.startup_metrics = self.startup_metrics, {}
        peaks = self.group.get([actor.__ray_call__.remote(peak_memory) for actor in self.group.actors])
        on_gpu = any(kind == "cuda" for kind, _ in peaks)
        # the ranks' processes share the host's memory; each has its own GPU
        peak = max(g for _, g in peaks) if on_gpu else sum(g for _, g in peaks)
        merged = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
        return {**merged, "peak_memory_gib": peak, **startup}

    def _logprobs(self, batch: TokenBatch, reference: bool) -> torch.Tensor:
        import torch

        self._check(batch)
        shards, rows = self._per_worker(batch, 1)
        parts = self.group.call_each("logprobs", [(s, reference) for s in shards])
        by_dp = {self.dp_rank[i]: p for i, p in enumerate(parts) if self.reports[i]}
        width = batch["input_ids"].shape[1]
        ordered = [torch.nn.functional.pad(by_dp[d], (0, width - by_dp[d].shape[1])) for d in range(self.dp)]
        return torch.cat(ordered)[:rows]

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return self._logprobs(batch, reference=False)

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return self._logprobs(batch, reference=True)

    # -- weights, checkpoints, memory -----------------------------------------------------------------------------

    def weights_for_refit(self, route: RefitRoute) -> RefitPayload:
        payloads = [p for p in self.group.call("weights_for_refit", route) if p is not None]
        if len(payloads) != 1:
            raise RuntimeError(f"expected one refit payload (from rank 0), got {len(payloads)}")
        return payloads[0]

    def save_checkpoint(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.group.call("save_checkpoint", str(path))

    def load_checkpoint(self, path: Path) -> None:
        problem = self.check_checkpoint(Path(path))
        if problem is not None:
            raise InputError(f"{path} is not a checkpoint of this backend: {problem}")
        self.group.call("load_checkpoint", str(path))

    def export_hf(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.group.call("export_hf", str(path))

    def offload(self) -> None:
        self.group.call("offload")

    def onload(self) -> None:
        self.group.call("onload")

    def shutdown(self) -> None:
        self.group.shutdown()


#: one sampled response as a replica returns it: (prompt_index, sample_index, token_ids, text, logprobs, finish).


def balance(prompts: Sequence[Sequence[int]], replicas: int) -> list[list[int]]:
    """Prompt indices per replica, longest first onto the least-loaded replica (by prompt tokens)."""
    loads = [0] * replicas
    out: list[list[int]] = [[] for _ in range(replicas)]
    for i in sorted(range(len(prompts)), key=lambda i: -len(prompts[i])):
        r = loads.index(min(loads))
        out[r].append(i)
        loads[r] += len(prompts[i]) + 1
    return [sorted(x) for x in out]


class GroupEngine:
    """``rl_core.contracts.protocols.RolloutEngine`` over the replicas of ``group``, each ``processes_per_replica`` processes
    holding weights (tensor-parallel ranks); prompts are spread over replicas by token count. ``max_model_len`` and
    ``len_key`` (the config key that sets it) bound prompt + response. ``concurrent_requests``: the replicas serve
    overlapping calls together (async actors over an engine with continuous batching). ``takes_adapters``: with
    ``policy.lora`` on, refits send the replicas only the adapters' tensors (their models carry the adapters)."""

    def __init__(
        self,
        group: WorkerGroup,
        *,
        max_model_len: int,
        len_key: str,
        processes_per_replica: int = 1,
        concurrent_requests: bool = False,
        takes_adapters: bool = False,
    ) -> None:
        self.group = group
        self.max_model_len, self.len_key = max_model_len, len_key
        self.processes_per_replica = processes_per_replica
        self.concurrent_requests = concurrent_requests
        self.takes_adapters = takes_adapters
        self._calls = 0  # rotates which replica a call's first (or only) prompt goes to

    def _check(self, prompts: Sequence[Sequence[int]]) -> None:
        if not prompts:
            raise InputError("generate() was given no prompts")
        for i, p in enumerate(prompts):
            if not p:
                raise InputError(f"prompt {i} is empty")
            if len(p) + 1 > self.max_model_len:
                raise InputError(
                    f"prompt {i} has {len(p)} tokens; the engine's max_model_len is {self.max_model_len} ({self.len_key})"
                )

    def _plan(self, prompts: Sequence[Sequence[int]]) -> list[tuple[Any, list[int]]]:
        """Prompts spread over the replicas; the replicas' order rotates from call to call, so that many small calls
        (one episode's turn each) spread too."""
        actors = self.group.actors
        first, self._calls = self._calls % len(actors), self._calls + 1
        rotated = actors[first:] + actors[:first]
        return [(actor, idx) for actor, idx in zip(rotated, balance(prompts, len(actors)), strict=True) if idx]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Rollout]:
        self._check(prompts)
        params = attrs.asdict(sampling)
        refs = [a.generate.remote(idx, [prompts[i] for i in idx], params) for a, idx in self._plan(prompts)]
        samples = [s for part in self.group.get(refs) for s in part]
        return sorted((to_rollout(s, prompts) for s in samples), key=lambda r: (r.prompt_index, r.sample_index))

    async def stream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> AsyncIterator[Rollout]:
        """Rollouts as they finish, across replicas (Ray streaming generators)."""

        self._check(prompts)
        params = attrs.asdict(sampling)
        generators = [
            a.stream.options(num_returns="streaming").remote(idx, [prompts[i] for i in idx], params)
            for a, idx in self._plan(prompts)
        ]
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(gen: Any) -> None:
            try:
                async for ref in gen:
                    await queue.put(await ref)
            except BaseException as exc:  # a replica failed: the consumer raises it (instead of waiting forever)
                await queue.put(exc)
            finally:
                await queue.put(None)

        tasks = [asyncio.ensure_future(pump(g)) for g in generators]
        done = 0
        try:
            while done < len(tasks):
                item = await queue.get()
                if item is None:
                    done += 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield to_rollout(item, prompts)
        finally:
            for task in tasks:
                task.cancel()

    def weight_receivers(self) -> list[str]:
        return [w.ip for w in self.group.info for _ in range(self.processes_per_replica)]

    def update_weights(self, payload: RefitPayload) -> RefitStats:
        """Every replica reloads the full weights; on the broadcast route replica ``r``'s processes are the
        receivers ``1 + r * processes_per_replica ...`` of the refit group."""
        start = time.perf_counter()
        per = self.processes_per_replica
        results = self.group.call_each(
            "update_weights", [(payload, 1 + r * per) for r in range(len(self.group.actors))]
        )
        return replicas_stats([row for replica in results for row in replica], time.perf_counter() - start)

    def sleep(self) -> None:
        self.group.call("sleep")

    def wake(self) -> None:
        self.group.call("wake")

    def shutdown(self) -> None:
        self.group.shutdown()


def to_rollout(sample: Sample, prompts: Sequence[Sequence[int]]) -> Rollout:
    index, j, ids, text, logprobs, finish = sample
    return Rollout(
        prompt_index=index,
        sample_index=j,
        prompt_token_ids=tuple(prompts[index]),
        token_ids=tuple(ids),
        text=text,
        logprobs=tuple(logprobs),
        finish_reason="length" if finish == "length" else "stop",
    )
