"""The driver side of the vLLM rollout engine: replicas as Ray actors (one vLLM engine each), driven by the core's
``GroupEngine``."""

from __future__ import annotations

from rl_core.api import Config, GroupEngine, detected_device, start_replicas
from rl_rollout_vllm.config import VllmConfig
from rl_rollout_vllm.worker import AsyncVllmWorker, VllmWorker, engine_environment


def uses_async_engine(config: Config, section: VllmConfig) -> bool:
    """Which flavour runs: vLLM's async engine (the GPU default), or ``LLM`` in the actor's process."""
    return section.async_engine if section.async_engine is not None else detected_device(config) == "cuda"


def make_engine(config: Config, section: VllmConfig) -> GroupEngine:
    max_model_len = section.max_model_len or config.policy.max_total_sequence_length
    async_engine = uses_async_engine(config, section)
    scale = config.policy.lora.scale if config.policy.lora.enabled else None  # adapters alone at each refit
    group = start_replicas(
        AsyncVllmWorker if async_engine else VllmWorker,
        config,
        lambda rank: dict(cfg=section, max_model_len=max_model_len, seed=config.seed + rank, adapter_scale=scale),
        processes_per_replica=section.tensor_parallel_size,
        env_vars=engine_environment(section),
    )
    return GroupEngine(
        group,
        max_model_len=max_model_len,
        len_key="policy.generation.vllm_cfg.max_model_len / policy.max_total_sequence_length",
        processes_per_replica=section.tensor_parallel_size,
        concurrent_requests=async_engine,
        takes_adapters=scale is not None,
    )
