"""The Ray layer: start or join a cluster, place groups of worker actors, call them, and report dead workers.

Workers are plain classes; ``WorkerGroup`` wraps them as Ray actors in a placement group (``pack`` or ``spread``
over nodes). torch.distributed rendezvous uses the address Ray reports for rank 0, never ``localhost``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl_core.config import ClusterConfig
from rl_core.errors import RLCoreError

log = logging.getLogger(__name__)


class WorkerDiedError(RLCoreError):
    """A worker process died; the message names the worker and its node."""


def init_ray(cfg: ClusterConfig) -> None:
    """Join ``cluster.address`` (or ``RAY_ADDRESS``), else start a local Ray (once per process)."""
    import ray

    if ray.is_initialized():
        return
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}}
    if address:
        log.info("joining Ray cluster at %s", address)
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return
    # Logical CPUs for scheduling; workers set their own thread counts. At least 8 so that a trainer group and
    # an engine fit on a 2-core laptop (they take turns: generation, then training).
    num_cpus = cfg.num_cpus or max(os.cpu_count() or 1, 8)
    ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=env, log_to_driver=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_address() -> tuple[str, str]:
    """(node IP as Ray reports it, Ray node id) of the calling process."""
    import ray

    return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()


class WorkerGroup:
    """``size`` Ray actors of ``worker_cls`` in one placement group; ``make_args(rank) -> kwargs``."""

    def __init__(
        self,
        worker_cls: type,
        size: int,
        make_args: Callable[[int], Mapping[str, Any]],
        *,
        name: str,
        placement: str = "pack",
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0.0,
        env_vars: Mapping[str, str] | None = None,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.name = name
        bundle = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        strategy = "SPREAD" if placement == "spread" else "PACK"
        self.pg = placement_group([dict(bundle) for _ in range(size)], strategy=strategy)
        ray.get(self.pg.ready(), timeout=300)
        remote = ray.remote(worker_cls)
        self.actors = [
            remote.options(
                num_cpus=cpus_per_worker,
                num_gpus=gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=rank
                ),
                runtime_env={"env_vars": dict(env_vars or {})},
                name=None,
            ).remote(**make_args(rank))
            for rank in range(size)
        ]
        self._wait_started()

    def _wait_started(self) -> None:
        """Wait until every worker's constructor ran; a failure names the worker and the original error."""
        import ray
        from ray.exceptions import RayError

        for rank, actor in enumerate(self.actors):
            try:
                ray.get(actor.__ray_ready__.remote())
            except RayError as exc:
                self.shutdown()
                raise WorkerDiedError(f"worker {self.name}[{rank}] failed to start: {_root_cause(exc)}") from None

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every worker with the same arguments; wait for all."""
        return self.get([getattr(a, method).remote(*args, **kwargs) for a in self.actors])

    def call_each(self, method: str, per_rank: Sequence[Sequence[Any]]) -> list[Any]:
        """Call ``method`` on worker ``i`` with ``*per_rank[i]``; wait for all."""
        return self.get([getattr(a, method).remote(*args) for a, args in zip(self.actors, per_rank, strict=True)])

    def get(self, refs: Sequence[Any]) -> list[Any]:
        """``ray.get`` that turns a dead actor into a ``WorkerDiedError`` naming the worker and its node."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        try:
            return ray.get(list(refs))
        except (RayActorError, ActorDiedError, ActorUnavailableError) as exc:
            raise WorkerDiedError(self._describe_death(exc)) from exc

    def _describe_death(self, exc: BaseException) -> str:
        lines = [f"a worker of group {self.name!r} died: {type(exc).__name__}"]
        actor_id = getattr(exc, "actor_id", None)
        for rank, actor in enumerate(self.actors):
            if actor_id and actor._actor_id.hex() != actor_id:
                continue
            try:
                from ray.util.state import get_actor

                state = get_actor(actor._actor_id.hex())
                node = getattr(state, "node_id", "?") if state else "?"
                lines.append(f"  worker {self.name}[{rank}] on node {node}")
            except Exception:  # state API unavailable (no dashboard): name the rank only
                lines.append(f"  worker {self.name}[{rank}]")
        lines.append(f"  cause: {_root_cause(exc)}")
        lines.append("  resume the run from its last checkpoint with the same command")
        return "\n".join(lines)

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.pg)


def _root_cause(exc: BaseException) -> str:
    """The most specific line of a Ray error: the last ``SomeError: message`` line of the remote traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return line
    return lines[-1] if lines else repr(exc)
