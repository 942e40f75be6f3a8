"""The driver side of the Hugging Face generate engine: replicas as Ray actors, driven by the core's
``GroupEngine``."""

from __future__ import annotations

from pathlib import Path

from rl_core.api import Config, GroupEngine, WorkerGroup, detected_device, engine_layout
from rl_rollout_hf.config import HfGenerateConfig


def make_engine(config: Config, section: HfGenerateConfig) -> GroupEngine:
    from rl_rollout_hf.worker import HfWorker

    device = detected_device(config)
    group = WorkerGroup(
        HfWorker,
        engine_layout(config, device, 1),
        lambda rank: dict(
            model_path=config.policy.model_name,
            cfg=section,
            replicas=config.policy.generation.num_replicas,
            dtype=config.policy.precision,
            device=device,
            trust_remote_code=config.policy.trust_remote_code,
        ),
        name="rollout",
        placement=config.cluster.placement,
        required_paths=[config.policy.model_name],
        log_dir=Path(config.run_dir).resolve() / "logs",
    )
    return GroupEngine(
        group, max_model_len=config.policy.max_total_sequence_length, len_key="policy.max_total_sequence_length"
    )
