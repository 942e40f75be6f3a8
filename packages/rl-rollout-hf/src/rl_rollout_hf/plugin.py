"""Entry point of the Hugging Face generate engine: light (no torch or transformers at import time)."""

from __future__ import annotations

from rl_core.api import RolloutEngineSpec, hookimpl, lazy
from rl_rollout_hf.config import HfGenerateConfig


@hookimpl
def rl_rollout_engines() -> list[RolloutEngineSpec]:
    return [
        RolloutEngineSpec(
            name="hf",
            priority=50,
            config_key="policy.generation.hf_cfg",
            config_class=HfGenerateConfig,
            factory=lazy("rl_rollout_hf.engine:make_engine"),
            description="Hugging Face generate (no vLLM needed), in-place weight refit",
            package="rl-rollout-hf",
        )
    ]
