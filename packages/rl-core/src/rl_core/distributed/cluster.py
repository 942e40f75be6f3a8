"""The Ray layer: start or join a cluster, place groups of worker actors, call them, and report dead workers.

Workers are plain classes; ``WorkerGroup`` wraps them as Ray actors placed as a ``rl_core.distributed.placement.GroupLayout``
says (``pack`` or ``spread`` over nodes). torch.distributed rendezvous uses the address Ray reports for rank 0,
never ``localhost``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from rl_core.base.errors import RLCoreError
from rl_core.base.schema import ClusterConfig
from rl_core.distributed.placement import GroupLayout

log = logging.getLogger(__name__)


class WorkerDiedError(RLCoreError):
    """A worker process died; the message names the worker and its node."""


def init_ray(cfg: ClusterConfig, *, verbose: bool = True) -> None:
    """Join ``cluster.address`` (or ``RAY_ADDRESS``), else start a local Ray (once per process). Unless
    ``verbose``, Ray's own messages and the workers' output stay off the terminal (workers write
    ``RUN_DIR/logs/``). The process's SIGTERM handler is the one it had before (``ray.init`` installs its own, and
    its core worker one that prints a raw stack dump and aborts)."""
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    token = use_auth_token(cfg) if address else False  # before Ray is imported: it reads RAY_AUTH_MODE then
    import ray

    if ray.is_initialized():
        return
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        _init_ray(cfg, address, token, verbose)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _init_ray(cfg: ClusterConfig, address: str | None, token: bool, verbose: bool) -> None:
    import ray

    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}}
    if address:
        log.info("joining Ray cluster at %s (token authentication %s)", address, "on" if token else "off")
        try:
            ray.init(address=address, runtime_env=env, log_to_driver=verbose, logging_level=_ray_level(verbose))
        except ConnectionError as exc:
            hint = (
                "the cluster may require token authentication: put its token in RAY_AUTH_TOKEN, or in a file named by "
                "cluster.auth_token_file (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token)"
                if not token
                else "check that the token matches the cluster's (RAY_AUTH_TOKEN on every node)"
            )
            raise RLCoreError(f"cannot join the Ray cluster at {address}: {exc}; {hint}") from None
        alive = sum(1 for node in ray.nodes() if node.get("Alive"))
        if alive < cfg.num_nodes:
            raise RLCoreError(
                f"cluster.num_nodes is {cfg.num_nodes}, but the Ray cluster at {address} has {alive} live node(s); "
                "start Ray on the missing nodes, or lower cluster.num_nodes"
            )
        return
    # Logical CPUs for scheduling; workers set their own thread counts.
    num_cpus = cfg.cpus_per_node or max(os.cpu_count() or 1, 8)
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        runtime_env=env,
        log_to_driver=verbose,
        logging_level=_ray_level(verbose),
    )
    reap_when_gone(os.getpid())


#: run by ``reap_when_gone`` in a process of its own: wait for the driver, then end what its Ray left behind.
_REAPER = """
import sys, time
import psutil

driver = int(sys.argv[1])
targets = []
for item in sys.argv[2:]:
    pid, created = item.split(":")
    try:
        p = psutil.Process(int(pid))
        if abs(p.create_time() - float(created)) < 1e-3:
            targets.append(p)
    except psutil.Error:
        pass
while psutil.pid_exists(driver):
    time.sleep(1.0)
time.sleep(3.0)  # a clean ray.shutdown() needs no help
for p in targets:
    try:
        for child in p.children(recursive=True):
            child.kill()
        p.kill()
    except psutil.Error:
        pass
"""


def reap_when_gone(driver_pid: int) -> None:
    """Ray's local processes (GCS, raylet and their agents) outlive a driver killed with SIGKILL: a small process
    of its own session waits for the driver and then ends the ones this driver started."""

    import psutil

    started = [f"{p.pid}:{p.create_time()}" for p in psutil.Process(driver_pid).children(recursive=True)]
    if started:
        subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(driver_pid), *started],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def _ray_level(verbose: bool) -> int:
    return logging.INFO if verbose else logging.ERROR


def use_auth_token(cfg: ClusterConfig) -> bool:
    """Turn on Ray token authentication (``RAY_AUTH_MODE=token``) when a token is at hand; returns whether it is.

    A Ray 2.60 cluster started with ``RAY_AUTH_MODE=token`` requires the token from every client; a client must
    set ``RAY_AUTH_MODE=token`` and find the token in ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``.
    """
    if cfg.auth_token_file:
        if not Path(cfg.auth_token_file).is_file():
            raise RLCoreError(f"cluster.auth_token_file: {cfg.auth_token_file} does not exist")
        os.environ["RAY_AUTH_TOKEN_PATH"] = cfg.auth_token_file
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode:
        return mode == "token"
    # Not ~/.ray/auth_token: a local ray.init() writes it, and token mode against a cluster without
    # authentication makes every actor die at start.
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        os.environ["RAY_AUTH_MODE"] = "token"
        return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_address() -> tuple[str, str]:
    """(node IP as Ray reports it, Ray node id) of the calling process."""
    import ray

    return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()


def tee_output(path: str) -> None:
    """Copy this process's stdout and stderr (and its logging) into ``path``, so that the driver can show a
    dead worker's last lines."""

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sink = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    class Tee:
        def __init__(self, stream: Any) -> None:
            self.stream = stream

        def write(self, text: str) -> int:
            sink.write(text)
            return self.stream.write(text)

        def flush(self) -> None:
            sink.flush()
            self.stream.flush()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.stream, name)

    sys.stdout, sys.stderr = Tee(sys.stdout), Tee(sys.stderr)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _with_log(worker_cls: type) -> type:
    """``worker_cls`` whose constructor first tees the process output into the file given as ``rl_log_path``."""

    class Logged(worker_cls):
        def __init__(self, *, rl_log_path: str, **kwargs: Any) -> None:
            tee_output(rl_log_path)
            super().__init__(**kwargs)

    Logged.__name__ = Logged.__qualname__ = worker_cls.__name__
    return Logged


def _missing_paths(paths: Sequence[str]) -> tuple[str, str, list[str]]:
    ip, node_id = node_address()
    return ip, node_id, [p for p in paths if not os.path.exists(p)]


def _whoami(_self: Any) -> tuple[int, str, str]:
    ip, node_id = node_address()
    return os.getpid(), ip, node_id


@attrs.frozen(kw_only=True)
class WorkerInfo:
    rank: int
    pid: int
    ip: str
    node_id: str


class _SharedGroups:
    """The colocated placement groups, one per run key, removed when the last worker group using one shuts down."""

    def __init__(self) -> None:
        self.groups: dict[str, tuple[Any, int]] = {}

    def acquire(self, key: str, bundles: Sequence[Mapping[str, float]], strategy: str) -> Any:
        from ray.util.placement_group import placement_group

        if key in self.groups:
            pg, users = self.groups[key]
            self.groups[key] = (pg, users + 1)
            return pg
        pg = placement_group([dict(b) for b in bundles], strategy=strategy)
        self.groups[key] = (pg, 1)
        return pg

    def release(self, key: str) -> bool:
        """Whether the caller was the last user (and should remove the placement group)."""
        pg, users = self.groups[key]
        if users > 1:
            self.groups[key] = (pg, users - 1)
            return False
        del self.groups[key]
        return True


_SHARED = _SharedGroups()


def _gpu_ids() -> list[str]:
    import ray

    return [str(i) for i in ray.get_gpu_ids()]


class WorkerGroup:
    """Ray actors of ``worker_cls`` placed as ``layout`` says; ``make_args(rank) -> kwargs``.

    Before the actors start, every node of the group checks that it sees ``required_paths`` (model folders,
    the run folder); each actor's output is copied to ``log_dir/NAME-RANK.log``.
    """

    def __init__(
        self,
        worker_cls: type,
        layout: GroupLayout,
        make_args: Callable[[int], Mapping[str, Any]],
        *,
        name: str,
        placement: str = "pack",
        env_vars: Mapping[str, str] | None = None,
        required_paths: Sequence[str] = (),
        log_dir: Path | None = None,
    ) -> None:
        import ray

        self.name = name
        self.log_dir = log_dir
        self.layout = layout
        self.actors: list[Any] = []
        self.pg = self._place(layout, "SPREAD" if placement == "spread" else "PACK")
        self._check_paths(required_paths)
        remote: Any = ray.remote(_with_log(worker_cls) if log_dir is not None else worker_cls)
        visible = self._visible_gpus()
        for rank in range(layout.size):
            kwargs = dict(make_args(rank))
            if log_dir is not None:
                kwargs["rl_log_path"] = str(log_dir / f"{name}-{rank}.log")
            self.actors.append(
                remote.options(
                    num_cpus=layout.num_cpus,
                    num_gpus=layout.num_gpus,
                    scheduling_strategy=self._bundle(layout.bundle_index[rank]),
                    runtime_env={"env_vars": self._env(env_vars, visible[rank] if visible is not None else None)},
                ).remote(**kwargs)
            )
        self._wait_started()
        self.info = [
            WorkerInfo(rank=rank, pid=pid, ip=ip, node_id=node)
            for rank, (pid, ip, node) in enumerate(self.get([a.__ray_call__.remote(_whoami) for a in self.actors]))
        ]
        log.info(self.describe())

    def _place(self, layout: GroupLayout, strategy: str) -> Any:
        """The group's placement group (shared with a colocated group), ready; an error naming the resources when the
        cluster cannot place it within 5 minutes."""
        import ray
        from ray.util.placement_group import placement_group

        if layout.shared:
            pg = _SHARED.acquire(layout.shared, layout.bundles, strategy)
        else:
            pg = placement_group([dict(b) for b in layout.bundles], strategy=strategy)
        self.pg = pg
        try:
            ray.get(pg.ready(), timeout=300)
        except ray.exceptions.GetTimeoutError:
            self._remove_placement()
            raise RLCoreError(
                f"the cluster cannot place {list(layout.bundles)} for worker group {self.name!r} within 5 minutes: "
                f"resources available: {ray.available_resources()}"
            ) from None
        return pg

    def _env(self, env_vars: Mapping[str, str] | None, gpus: list[str] | None) -> dict[str, str]:
        """One actor's environment variables: the caller's, its thread budget, and the GPUs it sees."""
        env = dict(env_vars or {})
        if self.layout.threads is not None:
            env["RL_CORE_THREADS"] = str(self.layout.threads)
        if gpus is not None:
            # Ray would show this actor only the GPU of its own share: it sees the GPUs of all its bundles
            env.update(CUDA_VISIBLE_DEVICES=",".join(gpus), RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES="1")
        return env

    def _visible_gpus(self) -> list[list[str]] | None:
        """Per actor, the GPU ids of the bundles it sees (``layout.visible_bundles``), asked of Ray in each bundle."""
        import ray

        if self.layout.visible_bundles is None:
            return None
        probe = ray.remote(num_cpus=0, num_gpus=0.01)(_gpu_ids)
        needed = sorted({b for bundles in self.layout.visible_bundles for b in bundles})
        ids = dict(zip(needed, ray.get([probe.options(scheduling_strategy=self._bundle(b)).remote() for b in needed])))
        return [[gpu for b in bundles for gpu in ids[b]] for bundles in self.layout.visible_bundles]

    def _bundle(self, rank: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=rank)

    def _check_paths(self, paths: Sequence[str]) -> None:
        """Every node of the group must see ``paths``; the error names the nodes that do not."""
        import ray

        if not paths:
            return
        probe = ray.remote(num_cpus=0)(_missing_paths)
        bundles = sorted(set(self.layout.bundle_index))
        results = ray.get([probe.options(scheduling_strategy=self._bundle(b)).remote(list(paths)) for b in bundles])
        problems = {
            f"node {ip} ({node[:12]}) cannot see {', '.join(missing)}" for ip, node, missing in results if missing
        }
        if problems:
            self.shutdown()
            raise RLCoreError(
                f"worker group {self.name!r}: {'; '.join(sorted(problems))}. Files every node reads (the model, "
                "checkpoints, the run folder) must be on a path all nodes share"
            )

    def describe(self) -> str:
        """``policy workers: [0] pid 12 on 10.0.0.1 (node 3f2a...), [1] ...``"""
        where = ", ".join(f"[{w.rank}] pid {w.pid} on {w.ip} (node {w.node_id})" for w in self.info)
        return f"{self.name} workers: {where}"

    def _wait_started(self) -> None:
        """Wait until every worker's constructor ran; a failure names the worker and the original error."""
        import ray
        from ray.exceptions import RayError

        for rank, actor in enumerate(self.actors):
            try:
                ray.get(actor.__ray_ready__.remote())
            except RayError as exc:
                tail = self._log_tail(rank)
                self.shutdown()
                raise WorkerDiedError(f"worker {self.name}[{rank}] failed to start: {_root_cause(exc)}{tail}") from None

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every worker with the same arguments; wait for all."""
        return self.get([getattr(a, method).remote(*args, **kwargs) for a in self.actors])

    def call_each(self, method: str, per_rank: Sequence[Sequence[Any]]) -> list[Any]:
        """Call ``method`` on worker ``i`` with ``*per_rank[i]``; wait for all."""
        return self.get([getattr(a, method).remote(*args) for a, args in zip(self.actors, per_rank, strict=True)])

    def get(self, refs: Sequence[Any]) -> list[Any]:
        """Results in order, failing fast: a dead worker is a ``WorkerDiedError`` naming the worker, its node and
        its last log lines (without waiting for ranks blocked in a collective with it)."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)
            return ray.get(list(refs))
        except RayActorError as exc:
            raise WorkerDiedError(self._describe_death(exc)) from exc
        except RayTaskError as exc:
            # A rank failing inside a collective usually means that a peer died: report the death, not the echo.
            death = self._find_death(pending)
            if death is not None:
                raise WorkerDiedError(self._describe_death(death)) from exc
            raise

    @staticmethod
    def _find_death(pending: Sequence[Any], timeout: float = 10.0) -> BaseException | None:
        import ray
        from ray.exceptions import RayActorError, RayError

        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=timeout) if pending else ([], [])
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError as exc:
                return exc
            except RayError:
                continue
        return None

    def _rank_of(self, exc: BaseException) -> int | None:
        actor_id = getattr(exc, "actor_id", None)
        for rank, actor in enumerate(self.actors):
            if actor_id and actor._actor_id.hex() == actor_id:
                return rank
        return None

    def _describe_death(self, exc: BaseException) -> str:
        rank = self._rank_of(exc)
        info = getattr(self, "info", [])
        if rank is not None and rank < len(info):
            w = info[rank]
            who = f"worker {self.name}[{rank}] (pid {w.pid}) on node {w.ip} ({w.node_id})"
        else:
            who = f"a worker of group {self.name!r}" + (f" ({self.name}[{rank}])" if rank is not None else "")
        tail = self._log_tail(rank) if rank is not None else ""
        return f"{who} died: {_root_cause(exc)}{tail}\nResume the run from its last checkpoint with the same command."

    def _log_tail(self, rank: int, lines: int = 20) -> str:
        if self.log_dir is None:
            return ""
        path = self.log_dir / f"{self.name}-{rank}.log"
        if not path.is_file():
            return f"\n(no log at {path})"
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"\nlast log lines ({path}):\n" + "\n".join(f"  | {line}" for line in text)

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        self._remove_placement()

    def _remove_placement(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if self.pg is None:
            return
        if not self.layout.shared or _SHARED.release(self.layout.shared):
            remove_placement_group(self.pg)
        self.pg = None


def _root_cause(exc: BaseException) -> str:
    """The most specific line of a Ray error: the last ``SomeError: message`` line of the remote traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return line
    return lines[-1] if lines else repr(exc)
