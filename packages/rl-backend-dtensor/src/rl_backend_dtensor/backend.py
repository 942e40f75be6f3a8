"""The driver side of the DTensor backend: ``DTensorWorker`` ranks (one per data-parallel rank) in Ray actors,
driven by the core's ``GroupBackend``."""

from __future__ import annotations

from pathlib import Path

from rl_backend_dtensor.config import DTensorConfig
from rl_core.api import Config, GroupBackend, WorkerGroup, check_model_folder, detected_device, policy_layout


def _check_checkpoint(path: Path) -> str | None:
    return None if (path / "extra.pt").is_file() else "no extra.pt (written by the dtensor backend's save)"


def make_backend(config: Config, section: DTensorConfig) -> GroupBackend:
    from rl_backend_dtensor.worker import DTensorWorker

    policy, device = config.policy, detected_device(config)
    check_model_folder(policy.model_name, trust_remote_code=policy.trust_remote_code)
    run_dir = Path(config.run_dir).resolve()
    group = WorkerGroup(
        DTensorWorker,
        policy_layout(config, device),
        lambda rank: dict(
            rank=rank,
            world_size=policy.num_workers,
            model_path=policy.model_name,
            policy=policy,
            cfg=section,
            seed=config.seed,
            device=device,
        ),
        name="policy",
        placement=config.cluster.placement,
        # the run folder (checkpoints) once the driver has made it: every node must see the same one
        required_paths=[policy.model_name, *[str(p) for p in [run_dir] if p.is_dir()]],
        log_dir=run_dir / "logs",
    )
    try:
        master = group.get([group.actors[0].address.remote()])[0]
        group.call("setup", *master)
    except BaseException:
        group.shutdown()
        raise
    return GroupBackend(group, policy, check_checkpoint=_check_checkpoint)
