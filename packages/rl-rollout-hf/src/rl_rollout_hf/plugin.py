"""Entry point of the Hugging Face generate engine: light (no torch or transformers at import time)."""

from __future__ import annotations

from rl_core.api import Config, RolloutEngine, RolloutEngineSpec, hookimpl
from rl_rollout_hf.config import HfGenerateConfig


def _factory(config: Config, section: HfGenerateConfig) -> RolloutEngine:
    from rl_rollout_hf.engine import make_engine

    return make_engine(config, section)


@hookimpl
def rl_rollout_engines() -> list[RolloutEngineSpec]:
    return [
        RolloutEngineSpec(
            name="hf",
            priority=50,
            config_key="policy.generation.hf_cfg",
            config_class=HfGenerateConfig,
            factory=_factory,
            description="Hugging Face generate (no vLLM needed), in-place weight refit",
            package="rl-rollout-hf",
        )
    ]
