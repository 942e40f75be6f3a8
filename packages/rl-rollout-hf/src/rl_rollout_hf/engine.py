"""The driver side of the Hugging Face generate engine: replicas as Ray actors, driven by the core's
``GroupEngine``."""

from __future__ import annotations

from rl_core.api import Config, GroupEngine, detected_device, start_replicas
from rl_rollout_hf.config import HfGenerateConfig


def make_engine(config: Config, section: HfGenerateConfig) -> GroupEngine:
    from rl_rollout_hf.worker import HfWorker

    device = detected_device(config)
    trust = config.policy.trust_remote_code
    adapters = config.policy.lora if config.policy.lora.enabled else None  # the trainer's adapters, refit alone

    def args(rank: int) -> dict[str, object]:
        return dict(cfg=section, device=device, trust_remote_code=trust, adapters=adapters)

    group = start_replicas(HfWorker, config, args)
    return GroupEngine(
        group,
        max_model_len=config.policy.max_total_sequence_length,
        len_key="policy.max_total_sequence_length",
        takes_adapters=adapters is not None,
    )
