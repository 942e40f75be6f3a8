"""Where worker groups go: the placement of the policy's ranks and the rollout engine's processes.

Three layouts, decided here from the config and the device alone (tested on CPU with GPUs declared to Ray):

- **CPU**: each group in a placement group of its own, one ``{CPU: 1}`` bundle per actor.
- **GPU, not colocated**: the policy gets one ``{GPU: 1}`` bundle per rank, the engine one ``{GPU: tp}`` bundle
  per replica (tp = its tensor-parallel size), in placement groups of their own: separate GPUs, which is what lets
  generation overlap training.
- **GPU, colocated** (``policy.generation.colocated``, the GPU default): one placement group shared by both, with a
  ``{GPU: 1, CPU: 2}`` bundle per policy rank. Policy rank ``i`` takes half of bundle ``i``'s GPU; engine replica
  ``r`` takes the other half of bundle ``r * tp`` and sees the GPUs of bundles ``r * tp .. r * tp + tp - 1``
  (Ray's own ``CUDA_VISIBLE_DEVICES`` is turned off for it and set from those bundles' GPU ids). The run takes
  turns on each GPU: engine awake and generating while the trainer is offloaded, then the engine asleep while the
  trainer trains. Needs ``num_replicas x tp <= policy.num_workers``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path
from typing import Literal

import attrs

from rl_core.base.errors import ConfigError
from rl_core.base.schema import Config

Device = Literal["cpu", "cuda"]


@attrs.frozen(kw_only=True)
class GroupLayout:
    """One worker group's placement: ``size`` actors, each in bundle ``bundle_index[i]`` of its placement group
    with ``num_cpus`` / ``num_gpus``; ``bundles`` are the placement group's bundles (when ``shared``, the run's
    colocated group, made once). ``visible_bundles[i]``: the bundles whose GPUs actor ``i`` sees (None: Ray's
    default, the GPU share the actor holds)."""

    size: int
    bundles: tuple[dict[str, float], ...]
    bundle_index: tuple[int, ...]
    num_cpus: float
    num_gpus: float
    #: the key of the run's colocated placement group (its run folder), or "" for a placement group of its own.
    shared: str = ""
    visible_bundles: tuple[tuple[int, ...], ...] | None = None
    #: CPU threads per actor when the group shares a CPU node with another that runs at the same time
    #: (``RL_CORE_THREADS``, read by ``thread_budget``); None: the workers' own default.
    threads: int | None = None


def detected_device(config: Config) -> Device:
    """``cluster.device`` unless ``auto``; then ``cuda`` when the driver sees a GPU or ``cluster.gpus_per_node`` > 0
    (workers on GPU nodes, driver on a CPU one), else ``cpu``."""
    if config.cluster.device != "auto":
        return config.cluster.device
    if config.cluster.gpus_per_node > 0:
        return "cuda"
    if "torch" not in sys.modules and _cpu_only_torch():
        return "cpu"  # what torch would say, without its import (~1.2 s of a `plugins --explain` or `--dry-run`)
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _cpu_only_torch() -> bool:
    """Whether torch is missing or a build for CPUs alone (its generated ``torch/version.py`` sets ``cuda`` and
    ``hip`` to None): read from that file; False (ask torch) when it says otherwise or cannot be read."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return True
    try:
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return False
    values: dict[str, object] = {}  # the file's top-level constants
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    values[target.id] = node.value.value
    return "cuda" in values and "hip" in values and values["cuda"] is None and values["hip"] is None


def overlaps(config: Config) -> bool:
    """Whether generation runs while training does (an algorithm section with ``ahead > 0``: async GRPO)."""
    return bool(getattr(config.sections.get(config.algorithm), "ahead", 0))


def cpu_split(config: Config, role: str, size: int) -> int | None:
    """On CPU with generation overlapping training, the node's cores are split: half to the policy's ranks, the
    rest to the engine's replicas (each share divided among the group's actors); None otherwise."""

    if not overlaps(config):
        return None
    cores = os.cpu_count() or 2
    share = max(1, cores // 2) if role == "policy" else max(1, cores - cores // 2)
    return max(1, share // size)


def thread_budget(fallback: int) -> int:
    """The CPU threads this worker may use: what its layout gave it (``RL_CORE_THREADS``), else ``fallback``."""

    given = os.environ.get("RL_CORE_THREADS")
    return int(given) if given else fallback


def colocated(config: Config, device: Device) -> bool:
    """Trainer and engine share GPUs (on CPU there is no device memory to hand over, so never)."""
    return config.policy.generation.colocated and device == "cuda"


def _run_key(config: Config) -> str:

    return str(Path(config.run_dir).resolve())


def _colocated_bundles(config: Config) -> tuple[dict[str, float], ...]:
    return tuple({"GPU": 1.0, "CPU": 2.0} for _ in range(config.policy.num_workers))


def policy_layout(config: Config, device: Device) -> GroupLayout:
    """The policy's ranks (``policy.num_workers``)."""
    world = config.policy.num_workers
    if colocated(config, device):
        return GroupLayout(
            size=world,
            bundles=_colocated_bundles(config),
            bundle_index=tuple(range(world)),
            num_cpus=1.0,
            num_gpus=0.5,
            shared=_run_key(config),
        )
    bundle = {"CPU": 1.0, **({"GPU": 1.0} if device == "cuda" else {})}
    return GroupLayout(
        size=world,
        bundles=tuple(dict(bundle) for _ in range(world)),
        bundle_index=tuple(range(world)),
        num_cpus=1.0,
        num_gpus=1.0 if device == "cuda" else 0.0,
        threads=cpu_split(config, "policy", world) if device == "cpu" else None,
    )


def engine_layout(config: Config, device: Device, tensor_parallel_size: int = 1) -> GroupLayout:
    """A rollout engine's replicas (``policy.generation.num_replicas``), each over ``tensor_parallel_size`` GPUs."""
    replicas, tp = config.policy.generation.num_replicas, tensor_parallel_size
    if colocated(config, device):
        if replicas * tp > config.policy.num_workers:
            raise ConfigError(
                f"colocated on GPUs, the engine's policy.generation.num_replicas x tensor_parallel_size "
                f"({replicas} x {tp}) must be <= policy.num_workers ({config.policy.num_workers}): the engine runs on "
                "the trainer's GPUs. Lower them, or set policy.generation.colocated=false to give the engine GPUs "
                "of its own"
            )
        return GroupLayout(
            size=replicas,
            bundles=_colocated_bundles(config),
            bundle_index=tuple(r * tp for r in range(replicas)),
            num_cpus=1.0,
            num_gpus=0.5,
            shared=_run_key(config),
            visible_bundles=tuple(tuple(range(r * tp, (r + 1) * tp)) for r in range(replicas)) if tp > 1 else None,
        )
    bundle = {"CPU": 1.0, **({"GPU": float(tp)} if device == "cuda" else {})}
    return GroupLayout(
        size=replicas,
        bundles=tuple(dict(bundle) for _ in range(replicas)),
        bundle_index=tuple(range(replicas)),
        num_cpus=1.0,
        num_gpus=float(tp) if device == "cuda" else 0.0,
        threads=cpu_split(config, "rollout", replicas) if device == "cpu" else None,
    )
