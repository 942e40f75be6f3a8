"""``RunContext``: everything an algorithm loop needs (config, components, checkpoints, loggers, the console), and
the small pieces it uses every step (phase timing, scoring, logging, checkpoints, resume)."""

from __future__ import annotations

import ast
import collections
import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from rl_core.base.errors import PluginError
from rl_core.base.schema import dump_yaml
from rl_core.distributed.placement import Device
from rl_core.rewards.combine import NamedRewardSource, score
from rl_core.training.signal import SignalWatch, limit_setting

if TYPE_CHECKING:
    from rl_core.base.schema import Config
    from rl_core.contracts.protocols import EpisodeDriver, MetricsLogger, Rollout, RolloutEngine, TrainingBackend
    from rl_core.data.prompts import FindTask
    from rl_core.outputs.checkpoint import CheckpointManager
    from rl_core.outputs.console import RunConsole
    from rl_core.training.episodes import EnvironmentRunner
    from rl_core.training.signal import SignalWatch


class Phases:
    """Wall-clock time per phase of a step, reported as ``time/<phase>`` metrics."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}


class HookRelay(Protocol):
    """The typed face of ``Registry.hook``: the lifecycle hooks, called with keyword arguments."""

    def rl_run_start(self, *, config: Config, run_dir: Path) -> list[None]: ...

    def rl_step(self, *, step: int, algorithm: str, run: Callable[[], dict[str, float]]) -> dict[str, float]: ...

    def rl_step_end(self, *, step: int, metrics: dict[str, float]) -> list[None]: ...

    def rl_checkpoint_saved(self, *, step: int, path: Path) -> list[None]: ...

    def rl_run_end(self, *, run_dir: Path, metrics: dict[str, float], error: BaseException | None) -> list[None]: ...


def no_tasks(name: str) -> Any:
    """The task lookup of a run context built without the registry's: every task is missing, saying so."""
    raise PluginError(f"no task {name!r}: this run context was built without the registry's tasks (find_task)")


@attrs.define
class RunContext:
    """Everything an algorithm loop needs, built by ``rl_core.launch.run``."""

    config: Config
    #: the lifecycle hooks of the run's plugins (``Registry.hook``).
    hook: HookRelay
    run_dir: Path
    console: RunConsole
    tokenizer: Any
    device: Device
    backend: TrainingBackend
    engine: RolloutEngine | None
    #: how the selection named the engine's plugin in messages (``'vllm' (rl-rollout-vllm[cpu])``).
    engine_name: str
    rewards: list[NamedRewardSource]
    checkpoints: CheckpointManager
    loggers: list[MetricsLogger]
    #: the final metrics, once the algorithm returns.
    metrics: dict[str, float] = attrs.Factory(dict)
    #: whether a colocated engine has released its memory to the trainer.
    engine_asleep: bool = False
    #: refits so far in this process (the weight-sync check samples them).
    refits: int = 0
    #: multi-turn episodes (``environment.name``), or what drives them (an agent host); None: single-turn rollouts.
    environment: EnvironmentRunner | EpisodeDriver | None = None
    #: the value model trained beside the policy (an algorithm with ``AlgorithmSpec.critic``: PPO); its checkpoint
    #: is each checkpoint's ``critic/``.
    critic: TrainingBackend | None = None
    #: seconds per start-up phase of this process (``rl_core.launch``), logged with its first step as ``startup/*``.
    startup: dict[str, float] = attrs.Factory(dict)
    #: reads each step's learning-signal figures and warns when they show the run cannot learn (a run's, with a
    #: console: not a context that drives episodes alone)
    watch: SignalWatch | None = attrs.field(
        default=attrs.Factory(
            lambda self: SignalWatch(*limit_setting(self.config), warn=self.console.warn) if self.console else None,
            takes_self=True,
        )
    )
    #: the task of a name (``data.task``), from the run's plugins (``Registry.task``; a context built without one
    #: reads data files only).
    find_task: FindTask = attrs.field(default=no_tasks)

    def keep_samples(self, step: int, transcripts: Sequence[Mapping[str, Any]], *, split: str = "train") -> None:
        """A few rollouts (prompt, turns, reward; grouped by prompt) to RUN_DIR/samples.jsonl and to each logger that
        takes samples (an optional ``log_samples(step, rows)``): the first ``logger.samples_per_prompt`` of each
        prompt, at most ``logger.max_samples`` rows, at step 1 (the model before any update), every
        ``logger.save_samples_every`` steps and at every validation (``split="val"``)."""

        cfg = self.config.logger
        due = split != "train" or step == 1 or step % cfg.save_samples_every == 0
        if not (transcripts and cfg.save_samples_every and due):
            return
        seen: collections.Counter[str] = collections.Counter()
        rows: list[dict[str, Any]] = []
        for t in transcripts:
            seen[str(t.get("prompt"))] += 1
            if seen[str(t.get("prompt"))] <= cfg.samples_per_prompt and len(rows) < cfg.max_samples:
                rows.append({"step": step, "split": split, **t})
        with (self.run_dir / "samples.jsonl").open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        for logger in self.loggers:
            log_samples = getattr(logger, "log_samples", None)
            if log_samples is not None:
                log_samples(step, rows)

    def check_signal(
        self,
        step: int,
        rollouts: Sequence[Rollout],
        rewards: Sequence[float],
        metrics: Mapping[str, float],
        transcripts: Sequence[Mapping[str, Any]],
    ) -> None:
        """A step's rollouts (their reward ``metrics``, their ``transcripts``), before its update: one kept for the
        warnings that quote a response; step 1's learning signal said, and a run without any warned or stopped
        (the preflight: ``health.preflight``; ``rl_core.training.signal``)."""
        if self.watch is None:
            return
        self.watch.saw(transcripts)
        if step == 1:
            fired = {k.removeprefix("signal/fired/"): v for k, v in metrics.items() if k.startswith("signal/fired/")}
            self.watch.preflight(rollouts, rewards, fired, self.config.health.preflight, self.console.info)

    # -- rewards ----------------------------------------------------------------------------------------------------

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        metadata: Sequence[Mapping[str, Any]],
        chunk_size: int | None = None,
    ) -> tuple[list[float], dict[str, float]]:
        """``rl_core.rewards.combine.score`` over this run's reward sources."""
        return score(self.rewards, prompts, responses, metadata, chunk_size)

    # -- steps, logging, checkpoints --------------------------------------------------------------------------------

    def step(self, step: int, body: Callable[[], dict[str, float]]) -> dict[str, float]:
        """Run one step through the ``rl_step`` hook (plugins may wrap it) and return its metrics."""
        return self.hook.rl_step(step=step, algorithm=self.config.algorithm, run=body)

    def log(self, step: int, metrics: Mapping[str, float], total_steps: int) -> None:
        for logger in self.loggers:
            logger.log(step, metrics)
        self.console.step(step, total_steps, metrics)
        if self.watch is not None:
            self.watch.step(step, metrics)
        self.hook.rl_step_end(step=step, metrics=dict(metrics))

    def resume(self) -> dict[str, Any] | None:
        """Load the newest complete checkpoint of the run folder that reads back, if any; return its saved state."""
        skipped: list[str] = []

        def skip(line: str) -> None:
            skipped.append(line)
            self.console.warn(line)

        latest = self.checkpoints.latest(skip)
        if latest is None and skipped:
            self.console.warn(
                f"no checkpoint in {self.checkpoints.root} is whole ({len(skipped)} skipped): training starts again "
                "from step 0, and the metrics logged before are dropped"
            )
        if latest is not None:
            self.console.info(f"resuming from {latest.path} (step {latest.step})")
            self.backend.load_checkpoint(latest.policy_dir)
            if self.critic is not None:
                self.critic.load_checkpoint(latest.path / "critic")
            restore_rng(latest.state.get("rng", {}))
        # metrics.jsonl drops the rows after the checkpoint's step (all of them when starting from step 0), so that
        # each step of this run appears once
        for logger in self.loggers:
            resume = getattr(logger, "resume", None)
            if resume is not None:
                resume(latest.step if latest is not None else -1)
        return dict(latest.state) if latest is not None else None

    def save(self, step: int, state: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        if not self.config.checkpointing.enabled:
            return
        full = {**state, "step": step, "metrics": dict(metrics), "rng": capture_rng()}
        also = {"critic": self.critic.save_checkpoint} if self.critic is not None else None
        path = self.checkpoints.save(step, full, self.backend.save_checkpoint, dump_yaml(self.config), also)
        self.hook.rl_checkpoint_saved(step=step, path=path)

    def due(self, step: int, period: int, last: int) -> bool:
        """Whether a periodic action (validation, checkpoint) is due after ``step`` (1-based count)."""
        return step % period == 0 or step == last


def capture_rng() -> dict[str, Any]:
    import torch

    return {"python": repr(random.getstate()), "torch": torch.get_rng_state().tolist()}


def restore_rng(state: Mapping[str, Any]) -> None:

    import torch

    if "python" in state:
        random.setstate(ast.literal_eval(state["python"]))
    if "torch" in state:
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
