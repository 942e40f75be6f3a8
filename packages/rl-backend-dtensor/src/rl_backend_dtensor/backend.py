"""The driver side of the DTensor backend: ``DTensorWorker`` ranks (one per data-parallel rank) in Ray actors,
driven by the core's ``GroupBackend``."""

from __future__ import annotations

from pathlib import Path

from rl_backend_dtensor.config import DTensorConfig
from rl_core.api import Config, GroupBackend, check_model_folder, start_ranks


def _check_checkpoint(path: Path) -> str | None:
    return None if (path / "extra.pt").is_file() else "no extra.pt (written by the dtensor backend's save)"


def make_backend(config: Config, section: DTensorConfig) -> GroupBackend:
    from rl_backend_dtensor.worker import DTensorWorker

    policy = config.policy
    check_model_folder(policy.model_name, trust_remote_code=policy.trust_remote_code)
    run_dir = Path(config.run_dir).resolve()
    # the run folder (checkpoints) once the driver has made it: every node must see the same one
    models = [policy.model_name, *([policy.reference_model_name] if policy.reference_model_name else [])]
    paths = [*models, *[str(p) for p in [run_dir] if p.is_dir()]]
    group, _setup = start_ranks(DTensorWorker, config, {"cfg": section}, required_paths=paths)
    return GroupBackend(group, policy, check_checkpoint=_check_checkpoint)
