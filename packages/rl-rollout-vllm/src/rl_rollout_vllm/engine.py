"""The driver side of the vLLM rollout engine: replicas as Ray actors, prompts spread by token count."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from rl_core.cluster import WorkerGroup
from rl_core.config import Config
from rl_core.errors import InputError
from rl_core.protocols import RefitStats, Rollout, SamplingParams
from rl_rollout_vllm.plugin import VllmConfig
from rl_rollout_vllm.worker import AsyncVllmWorker, Sample, VllmWorker, engine_environment


def balance(prompts: Sequence[Sequence[int]], replicas: int) -> list[list[int]]:
    """Prompt indices per replica, longest first onto the least-loaded replica (by prompt tokens)."""
    loads = [0] * replicas
    out: list[list[int]] = [[] for _ in range(replicas)]
    for i in sorted(range(len(prompts)), key=lambda i: -len(prompts[i])):
        r = loads.index(min(loads))
        out[r].append(i)
        loads[r] += len(prompts[i]) + 1
    return [sorted(x) for x in out]


class VllmEngine:
    """Implements ``rl_core.protocols.RolloutEngine``."""

    def __init__(self, config: Config, section: VllmConfig) -> None:
        import torch

        self.max_model_len = section.max_model_len or config.policy.max_total_sequence_length
        use_gpu = torch.cuda.is_available() or config.cluster.gpus_per_node > 0
        self.tensor_parallel_size = section.tensor_parallel_size
        #: which flavour runs: vLLM's async engine, or ``LLM`` in the actor's process
        self.async_engine = section.async_engine if section.async_engine is not None else torch.cuda.is_available()
        self.group = WorkerGroup(
            AsyncVllmWorker if self.async_engine else VllmWorker,
            config.policy.generation.num_replicas,
            lambda rank: dict(
                model_path=config.policy.model_name,
                cfg=section,
                replicas=config.policy.generation.num_replicas,
                dtype=config.policy.precision,
                max_model_len=self.max_model_len,
                seed=config.seed + rank,
            ),
            name="rollout",
            placement=config.cluster.placement,
            gpus_per_worker=float(section.tensor_parallel_size) if use_gpu else 0.0,
            env_vars=engine_environment(section),
            required_paths=[config.policy.model_name],
            log_dir=Path(config.run_dir).resolve() / "logs",
        )

    def _check(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> None:
        if not prompts:
            raise InputError("generate() was given no prompts")
        for i, p in enumerate(prompts):
            if not p:
                raise InputError(f"prompt {i} is empty")
            if len(p) + 1 > self.max_model_len:
                raise InputError(
                    f"prompt {i} has {len(p)} tokens; the engine's max_model_len is {self.max_model_len} "
                    "(policy.generation.vllm_cfg.max_model_len / policy.max_total_sequence_length)"
                )

    def _plan(self, prompts: Sequence[Sequence[int]]) -> list[tuple[Any, list[int]]]:
        parts = balance(prompts, len(self.group.actors))
        return [(actor, idx) for actor, idx in zip(self.group.actors, parts, strict=True) if idx]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Rollout]:
        self._check(prompts, sampling)
        params = attrs.asdict(sampling)
        refs = [a.generate.remote(idx, [prompts[i] for i in idx], params) for a, idx in self._plan(prompts)]
        samples = [s for part in self.group.get(refs) for s in part]
        return sorted((_rollout(s, prompts) for s in samples), key=lambda r: (r.prompt_index, r.sample_index))

    async def stream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> AsyncIterator[Rollout]:
        """Rollouts as each prompt's samples finish, across replicas (Ray streaming generators)."""
        import asyncio

        self._check(prompts, sampling)
        params = attrs.asdict(sampling)
        generators = [
            a.stream.options(num_returns="streaming").remote(idx, [prompts[i] for i in idx], params)
            for a, idx in self._plan(prompts)
        ]
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(gen: Any) -> None:
            async for ref in gen:
                await queue.put(await ref)
            await queue.put(None)

        tasks = [asyncio.ensure_future(pump(g)) for g in generators]
        done = 0
        while done < len(tasks):
            item = await queue.get()
            if item is None:
                done += 1
                continue
            yield _rollout(item, prompts)
        await asyncio.gather(*tasks)

    def weight_receivers(self) -> list[str]:
        return [w.ip for w in self.group.info for _ in range(self.tensor_parallel_size)]

    def update_weights(self, handles: Sequence[Any]) -> RefitStats:
        """Every replica reloads the full weights; on the broadcast route replica ``r``'s TP ranks are the
        receivers ``1 + r * tp ...`` of the refit group."""
        start = time.perf_counter()
        if len(handles) != 1:
            raise InputError(f"the vLLM engine expects one handle of full weights, got {len(handles)}")
        tp = self.tensor_parallel_size
        results = self.group.call_each(
            "update_weights", [(handles[0], 1 + r * tp) for r in range(len(self.group.actors))]
        )
        num_bytes, tensors, _ = results[0]
        return RefitStats(num_bytes=num_bytes, num_tensors=tensors, seconds=time.perf_counter() - start)

    def sleep(self) -> None:
        self.group.call("sleep")

    def wake(self) -> None:
        self.group.call("wake")

    def shutdown(self) -> None:
        self.group.shutdown()


def _rollout(sample: Sample, prompts: Sequence[Sequence[int]]) -> Rollout:
    index, j, ids, text, logprobs, finish = sample
    return Rollout(
        prompt_index=index,
        sample_index=j,
        prompt_token_ids=tuple(prompts[index]),
        token_ids=tuple(ids),
        text=text,
        logprobs=tuple(logprobs),
        finish_reason=finish,  # type: ignore[arg-type]
    )
