"""Running a config: pick the components, build them, run the algorithm, and show what happens.

``run_config`` is what ``rl-core run`` calls. It writes the resolved config to the run folder, logs which
training backend, rollout engine and reward sources the config selects (and the runners-up), starts or joins Ray,
resumes from the latest complete checkpoint in the run folder, and hands a ``RunContext`` to the algorithm.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from rl_core.checkpoint import CheckpointManager
from rl_core.config import Config, dump_yaml, enabled_map, load_config
from rl_core.errors import InputError
from rl_core.metrics import JsonlLogger
from rl_core.protocols import MetricsLogger, Reward, RewardSource, RolloutEngine, TrainingBackend, WeightTransport
from rl_core.registry import Registry, Selection
from rl_core.tiny_models import resolve_model_path

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class Selections:
    backend: Selection
    engine: Selection | None
    transport: Any | None
    rewards: tuple[str, ...]


def select_components(config: Config, registry: Registry) -> Selections:
    """What ``config`` selects, without building anything (``rl-core plugins --explain`` shows this)."""
    algorithm = registry.get("algorithm", config.algorithm)
    backend = registry.select(
        "training_backend",
        explicit=config.policy.backend,
        enabled=enabled_map(config, registry, "training_backend"),
        selector_key="policy.backend",
    )
    engine = transport = None
    if algorithm.uses_rollout:
        engine = registry.select(
            "rollout_engine",
            explicit=config.policy.generation.backend,
            enabled=enabled_map(config, registry, "rollout_engine"),
            selector_key="policy.generation.backend",
        )
        transport = pick_transport(registry, config, backend.chosen.name, engine.chosen.name)
        if not config.reward.sources:
            raise InputError(
                f"algorithm {config.algorithm!r} needs rewards: add reward.sources, e.g. [{{name: exact_match}}]"
            )
    return Selections(
        backend=backend, engine=engine, transport=transport, rewards=tuple(s.name for s in config.reward.sources)
    )


def detected_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu`` (device is detected, never configured)."""
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def pick_transport(registry: Registry, config: Config, backend: str, engine: str) -> Any:
    """``policy.generation.weight_transport`` if set, else the highest priority transport that serves the pair."""
    generation = config.policy.generation
    if generation.weight_transport is not None:
        return registry.get("weight_transport", generation.weight_transport)
    device = detected_device()
    specs = registry.specs("weight_transport").values()
    fits = [s for s in specs if s.supports(backend, engine, device, generation.colocated)]
    if not fits:
        raise InputError(
            f"no weight transport moves weights from backend {backend!r} to engine {engine!r} on {device} "
            f"(policy.generation.colocated={generation.colocated}); name one in policy.generation.weight_transport"
        )
    return max(fits, key=lambda s: s.priority)


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


@attrs.define
class RunContext:
    """Everything an algorithm loop needs, built by ``run_config``."""

    config: Config
    registry: Registry
    run_dir: Path
    console: Console
    tokenizer: Any
    backend: TrainingBackend
    engine: RolloutEngine | None
    transport: WeightTransport | None
    rewards: list[tuple[float, str, RewardSource]]
    checkpoints: CheckpointManager
    loggers: list[MetricsLogger]
    #: the final metrics, once the algorithm returns.
    metrics: dict[str, float] = attrs.Factory(dict)
    #: whether a colocated engine has released its memory to the trainer.
    engine_asleep: bool = False

    @property
    def hook(self) -> Any:
        return self.registry.hook

    # -- rewards ----------------------------------------------------------------------------------------------------

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> tuple[list[float], dict[str, float]]:
        """Weighted sum of all reward sources per response, and the mean of each named part."""
        total = [0.0] * len(responses)
        parts: dict[str, float] = {}
        for weight, name, source in self.rewards:
            values: list[Reward] = source.score(prompts, responses, metadata)
            if len(values) != len(responses):
                raise InputError(
                    f"reward source {name!r} returned {len(values)} rewards for {len(responses)} responses"
                )
            for i, value in enumerate(values):
                if isinstance(value, Mapping):
                    for key, part in value.items():
                        parts[f"reward/{name}/{key}"] = parts.get(f"reward/{name}/{key}", 0.0) + part / len(values)
                    value = sum(value.values())
                total[i] += weight * float(value)
            parts[f"reward/{name}"] = sum(
                float(sum(v.values()) if isinstance(v, Mapping) else v) for v in values
            ) / max(len(values), 1)
        return total, parts

    # -- steps, logging, checkpoints --------------------------------------------------------------------------------

    def step(self, step: int, body: Any) -> dict[str, float]:
        """Run one step through the ``rl_step`` hook (plugins may wrap it) and return its metrics."""
        return self.hook.rl_step(step=step, algorithm=self.config.algorithm, run=body)

    def log(self, step: int, metrics: Mapping[str, float], total_steps: int) -> None:
        for logger in self.loggers:
            logger.log(step, metrics)
        self.console.print(format_metrics_line(step, total_steps, metrics))
        self.hook.rl_step_end(step=step, metrics=dict(metrics))

    def resume(self) -> dict[str, Any] | None:
        """Load the latest complete checkpoint of the run folder, if any; return its saved state."""
        latest = self.checkpoints.latest()
        if latest is None:
            return None
        self.console.print(f"[bold]resuming[/bold] from {latest.path} (step {latest.step})")
        self.backend.load_checkpoint(latest.policy_dir)
        restore_rng(latest.state.get("rng", {}))
        if self.engine is not None:
            from rl_core.loops import refit

            refit(self)
        return dict(latest.state)

    def save(self, step: int, state: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        cfg = self.config.checkpointing
        if not cfg.enabled:
            return
        full = {**state, "step": step, "metrics": dict(metrics), "rng": capture_rng()}
        path = self.checkpoints.save(step, full, self.backend.save_checkpoint, dump_yaml(self.config))
        self.hook.rl_checkpoint_saved(step=step, path=path)

    def due(self, step: int, period: int, last: int) -> bool:
        """Whether a periodic action (validation, checkpoint) is due after ``step`` (1-based count)."""
        return step % period == 0 or step == last


def capture_rng() -> dict[str, Any]:
    import torch

    return {"python": repr(random.getstate()), "torch": torch.get_rng_state().tolist()}


def restore_rng(state: Mapping[str, Any]) -> None:
    import ast

    import torch

    if "python" in state:
        random.setstate(ast.literal_eval(state["python"]))
    if "torch" in state:
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def format_metrics_line(step: int, total: int, metrics: Mapping[str, float]) -> str:
    """``step 3/20  reward 0.531  kl 0.0012  loss -0.0104  tok/s 812  gen 1.2s score 0.0s ...``"""
    shown = []
    for key, label in (
        ("reward", "reward"),
        ("val/reward", "val_reward"),
        ("train/kl", "kl"),
        ("train/loss", "loss"),
        ("tokens_per_second", "tok/s"),
    ):
        if key in metrics:
            value = metrics[key]
            shown.append(f"{label} {value:.0f}" if key == "tokens_per_second" else f"{label} {value:.4g}")
    times = " ".join(f"{k.split('/', 1)[1]} {v:.2f}s" for k, v in metrics.items() if k.startswith("time/"))
    return (
        f"[bold cyan]step {step}/{total}[/bold cyan]  " + "  ".join(shown) + (f"  [dim]{times}[/dim]" if times else "")
    )


def make_loggers(config: Config, registry: Registry, run_dir: Path) -> list[MetricsLogger]:
    """JSONL always; each registered logger whose ``logger.<name>_enabled`` flag is on (plugins' loggers without
    a ``config_key`` are always on)."""
    out: list[MetricsLogger] = [JsonlLogger(run_dir)]
    for spec in registry.specs("logger").values():
        flag = spec.config_key.removeprefix("logger.") if spec.config_key else None
        if flag is None or getattr(config.logger, flag, False):
            out.append(spec.factory(config, run_dir))
    return out


def run_config(config: Config, registry: Registry, console: Console | None = None) -> dict[str, float]:
    """Run ``config`` to the end (resuming from the run folder's latest checkpoint) and return final metrics."""
    with open_run(config, registry, console) as ctx:
        ctx.metrics = registry.get("algorithm", ctx.config.algorithm).factory(ctx)
        if ctx.config.checkpointing.export_final_hf:
            ctx.backend.export_hf(ctx.run_dir / "final")
            ctx.console.print(f"final policy written to {ctx.run_dir / 'final'}")
        return ctx.metrics


@contextlib.contextmanager
def open_run(config: Config, registry: Registry, console: Console | None = None) -> Iterator[RunContext]:
    """Prepare a run (folder, resolved config, selection, Ray, components) and tear it down afterwards; the
    ``rl_run_start`` / ``rl_run_end`` hooks bracket it."""
    from rl_core.cluster import init_ray

    console = console or Console()
    run_dir = Path(config.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if config.warmup_recipe:
        config = _run_warmup(config, registry, run_dir, console)
    config = attrs.evolve(
        config, policy=attrs.evolve(config.policy, model_name=resolve_model_path(config.policy.model_name))
    )
    chosen = select_components(config, registry)
    (run_dir / "config.yaml").write_text(dump_yaml(config))
    console.print(f"[bold]run folder[/bold] {run_dir}")
    console.print(f"[bold magenta]{chosen.backend.describe()}[/bold magenta]")
    if chosen.engine is not None:
        console.print(f"[bold magenta]{chosen.engine.describe()}[/bold magenta]")
        console.print(f"weight transport: {chosen.transport.name}; reward sources: {', '.join(chosen.rewards)}")
    random.seed(config.seed)
    import torch

    torch.manual_seed(config.seed)
    init_ray(config.cluster)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.policy.tokenizer_name or config.policy.model_name)
    backend = chosen.backend.chosen.factory(config, config.sections.get(chosen.backend.chosen.config_key))
    engine = transport = None
    rewards: list[tuple[float, str, RewardSource]] = []
    loggers = make_loggers(config, registry, run_dir)
    ctx: RunContext | None = None
    error: BaseException | None = None
    try:
        if chosen.engine is not None:
            spec = chosen.engine.chosen
            engine = spec.factory(config, config.sections.get(spec.config_key))
            transport = chosen.transport.factory()
            for source in config.reward.sources:
                rs = registry.get("reward_source", source.name)
                rewards.append((source.weight, source.name, rs.factory(source.options)))
        ctx = RunContext(
            config=config,
            registry=registry,
            run_dir=run_dir,
            console=console,
            tokenizer=tokenizer,
            backend=backend,
            engine=engine,
            transport=transport,
            rewards=rewards,
            checkpoints=CheckpointManager(run_dir, config.checkpointing),
            loggers=loggers,
        )
        registry.hook.rl_run_start(config=config, run_dir=run_dir)
        yield ctx
    except BaseException as exc:
        error = exc
        raise
    finally:
        registry.hook.rl_run_end(run_dir=run_dir, metrics=ctx.metrics if ctx else {}, error=error)
        for logger in loggers:
            logger.close()
        for _w, _n, source in rewards:
            source.close()
        if engine is not None:
            engine.shutdown()
        backend.shutdown()


def _run_warmup(config: Config, registry: Registry, run_dir: Path, console: Console) -> Config:
    from rl_core.recipes import resolve_recipe

    warm_dir = run_dir / "warmup"
    final = warm_dir / "final"
    if not (final / "config.json").is_file():
        console.rule(f"warm-up: {config.warmup_recipe}")
        warm = load_config(
            resolve_recipe(config.warmup_recipe),
            [f"run_dir={warm_dir}", f"policy.model_name={config.policy.model_name}", f"seed={config.seed}"],
            registry,
        )
        run_config(
            attrs.evolve(warm, checkpointing=attrs.evolve(warm.checkpointing, export_final_hf=True)), registry, console
        )
        console.rule("warm-up done")
    return attrs.evolve(config, warmup_recipe=None, policy=attrs.evolve(config.policy, model_name=str(final)))
