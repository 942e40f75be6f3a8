"""The driver side of the DTensor backend: ``DTensorWorker`` ranks (one per data-parallel rank) in Ray actors,
driven by the core's ``GroupBackend``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_backend_dtensor.config import DTensorConfig
from rl_core.api import Config, GroupBackend, check_model_folder, start_ranks

log = logging.getLogger(__name__)


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
    group, setup = start_ranks(DTensorWorker, config, {"cfg": section}, required_paths=paths)
    found = setup[0]["shortcuts"]
    report_shortcuts(found)
    return GroupBackend(group, policy, check_checkpoint=_check_checkpoint, startup_metrics=found["metrics"])


def report_shortcuts(found: Mapping[str, Any]) -> None:
    """On the terminal, each shortcut the start-up check turned off; in the run's log, the others' figures and why
    those that do not apply to the model are off."""
    for name, why in found["off"].items():
        if why.startswith("the start-up check"):
            log.warning("policy.dtensor_cfg.%s is off for this run: %s", name, why)
        else:
            log.info("policy.dtensor_cfg.%s does not apply: %s", name, why)
    if found["checked"]:
        log.info("start-up check of the shortcuts (%.1f s): %s", found["seconds"], "; ".join(found["checked"]))
