"""Entry point of the DTensor backend: light (no torch at import time)."""

from __future__ import annotations

from rl_backend_dtensor.config import DTensorConfig
from rl_core.api import TrainingBackendSpec, hookimpl, lazy


@hookimpl
def rl_training_backends() -> list[TrainingBackendSpec]:
    return [
        TrainingBackendSpec(
            name="dtensor",
            priority=100,
            config_key="policy.dtensor_cfg",
            config_class=DTensorConfig,
            factory=lazy("rl_backend_dtensor.backend:make_backend"),
            description="PyTorch FSDP2 (DTensor) over Hugging Face models",
            lora=True,
            reference_model=True,
            score_head=True,
            package="rl-backend-dtensor",
        )
    ]
