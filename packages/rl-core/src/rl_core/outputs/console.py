"""What a person sees of a run: a few lines of set-up, one live progress display on a terminal (step, ETA, reward,
phase times, validation results) or one plain line per step when the output is not a terminal (never wrapped,
so that grep and log files read it whole), and an end-of-run summary.

Everything else (the workers' output, vLLM's and Ray's logs, Python warnings) goes to ``RUN_DIR/logs/`` unless
``rl-core --verbose``; ``rl_core.cli`` sets that up.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Column

#: metrics shown on the step line, with their labels, in this order.
SHOWN = (
    ("reward", "reward"),
    ("val/reward", "val_reward"),
    ("val/loss", "val_loss"),
    ("train/loss", "loss"),
    ("train/kl", "kl"),
    ("health/logprob_mismatch", "mismatch"),
    ("signal/equal_reward_groups", "alike"),
    ("truncated_fraction", "cut"),
    ("tokens_per_second", "tok/s"),
)


#: the learning-signal shares the summary averages (besides each reward source's ``signal/fired/NAME``)
SIGNAL = ("signal/reward_nonzero", "signal/equal_reward_groups", "truncated_fraction")


def metrics_line(step: int, total: int, metrics: Mapping[str, float], *, times: bool = True) -> str:
    """``step 3/20  reward 0.531  loss -0.0104  tok/s 812  generate 1.20s score 0.00s ...`` (plain text); without
    ``times``, the metrics only."""
    shown = []
    for key, label in SHOWN:
        if key in metrics:
            value = metrics[key]
            shown.append(f"{label} {value:.0f}" if key == "tokens_per_second" else f"{label} {value:.4g}")
    phases = " ".join(
        f"{k.split('/', 1)[1]} {v:.2f}s" for k, v in metrics.items() if k.startswith("time/") and k != "time/step"
    )
    return "  ".join([f"step {step}/{total}", *shown, *([phases] if phases and times else [])])


class RunConsole:
    """The run's terminal output. ``live``: a rich progress display (a terminal and ``logger.progress``)."""

    def __init__(self, console: Console | None = None, *, progress: bool = True, verbose: bool = False) -> None:
        self.console = console or Console()
        self.live = progress and self.console.is_terminal
        #: third-party output (workers, vLLM, Ray) on the terminal too, not only in RUN_DIR/logs.
        self.verbose = verbose
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self.reset()

    def reset(self) -> None:
        """Forget what the summary counts (after a warm-up run, before the main one)."""
        self.first_val: dict[str, float] = {}
        self.last_val: dict[str, float] = {}
        self.phase_seconds: dict[str, float] = {}
        #: each learning-signal share summed over the steps that logged it, and those steps
        self.signal: dict[str, list[float]] = {}
        self.steps_run = 0
        #: the step logged last (0 before the first)
        self.last_step = 0
        self.started = time.monotonic()

    # -- lines ----------------------------------------------------------------------------------------------------

    def _print(self, text: str, style: str | None = None) -> None:
        self.console.print(escape(text), style=style, soft_wrap=True, highlight=False)

    def info(self, text: str) -> None:
        self._print(text)

    def warn(self, text: str) -> None:
        self._print(f"warning: {text}", style="bold yellow")

    def section(self, title: str) -> None:
        self._print(f"== {title}", style="bold")

    # -- steps ----------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def steps(self, label: str, total: int, start: int) -> Iterator[None]:
        """The live display for steps ``start+1 .. total`` (nothing when not live)."""
        if not self.live:
            yield
            return
        # the step count and ETA keep their width at any terminal width; the metrics take what is left, cut short
        fixed = Column(no_wrap=True)
        progress = Progress(
            TextColumn("[bold]{task.description}", table_column=fixed),
            BarColumn(bar_width=16 if self.console.width < 120 else 30),
            MofNCompleteColumn(table_column=fixed),
            TextColumn("eta", table_column=fixed),
            TimeRemainingColumn(table_column=fixed),
            TextColumn("{task.fields[line]}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
            console=self.console,
            transient=True,
            expand=True,
        )
        self._progress, self._task = progress, progress.add_task(label, total=total, completed=start, line="")
        with progress:
            try:
                yield
            finally:
                self._progress = self._task = None

    def step(self, step: int, total: int, metrics: Mapping[str, float]) -> None:
        """A step's metrics: one plain line (not live), or the live display's line (validation steps also print)."""
        validation = {k: v for k, v in metrics.items() if k.startswith("val/")}
        if validation:
            self.first_val = self.first_val or dict(validation)
            self.last_val = dict(validation)
        for key, value in metrics.items():
            if key.startswith("time/") and key != "time/step":
                phase = key.removeprefix("time/")
                self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + value
            if key in SIGNAL or key.startswith("signal/fired/"):
                total_count = self.signal.setdefault(key, [0.0, 0.0])
                total_count[0] += value
                total_count[1] += 1
        if step > 0:
            self.steps_run += 1
        self.last_step = step
        if self._progress is None or self._task is None:
            self._print(metrics_line(step, total, metrics))
            return
        short = metrics_line(step, total, metrics, times=False)
        self._progress.update(self._task, completed=step, line=short.split("  ", 1)[-1])
        if validation or step == 0:  # a line that stays: the step and its validation, short enough not to wrap
            kept = {k: v for k, v in metrics.items() if k.startswith("val/") or k == "reward"}
            self._print(metrics_line(step, total, kept))

    def estimate(self, step: int, total: int, seconds: float, metrics: Mapping[str, float]) -> None:
        """After the first step a process runs: what it took by phase, the time the rest will take at that pace
        and when it ends, and the trainer's peak memory."""
        phases = ", ".join(
            f"{k.removeprefix('time/')} {v:.1f} s"
            for k, v in metrics.items()
            if k.startswith("time/") and k != "time/step"
        )
        left = (total - step) * seconds
        ends = time.strftime("%H:%M", time.localtime(time.time() + left))
        memory = metrics.get("train/peak_memory_gib")
        self._print(
            f"step {step} took {seconds:.1f} s"
            + (f" ({phases})" if phases else "")
            + (f"; the {total - step} steps left: about {_duration(left)}, ending near {ends}" if total > step else "")
            + " (validation and checkpoints besides)"
            + (f"; trainer peak memory {memory:.1f} GiB" if memory else "")
        )

    def interrupted(self, checkpoint: int | None) -> None:
        """Ctrl-C or SIGTERM: where the run stopped and what the same command will do."""
        resumes = f"resumes from its step-{checkpoint} checkpoint" if checkpoint is not None else "starts again"
        self._print(f"interrupted after step {self.last_step}; the same command {resumes}", style="bold red")

    # -- the end ----------------------------------------------------------------------------------------------------

    def summary(self, run_dir: Path, *, final: Path | None, checkpoints: Path | None) -> None:
        """Before/after validation, time per phase, and where the run's outputs are."""
        elapsed = time.monotonic() - self.started
        self.section(f"done in {elapsed:.0f} s ({self.steps_run} steps)")
        for key in sorted(self.last_val):
            before = self.first_val.get(key)
            after = self.last_val[key]
            self._print(f"  {key}: {before:.4g} -> {after:.4g}" if before is not None else f"  {key}: {after:.4g}")
        total = sum(self.phase_seconds.values())
        if total > 0:  # shares of the whole run; the rest is what no step phase times
            parts = [*self.phase_seconds.items(), ("start-up and checkpoints", max(elapsed - total, 0.0))]
            phases = ", ".join(f"{k} {v:.0f} s ({100 * v / elapsed:.0f}%)" for k, v in parts)
            self._print(f"  time: {phases}")
        if self.signal:
            self._print(f"  learning signal (mean of the steps): {signal_line(self.signal)}")
        self._print(f"  metrics: {run_dir / 'metrics.jsonl'} (plot: rl-core plot {run_dir})")
        if checkpoints is not None:
            self._print(f"  checkpoints: {checkpoints}")
        if final is not None:
            self._print(f"  final model (Hugging Face): {final}")
        self._print(f"  logs: {run_dir / 'logs'}")


def signal_line(sums: Mapping[str, list[float]]) -> str:
    """``rewards non-zero 41% (number_match 41%), prompts alike 25%, cut at the limit 2%`` from each share's
    (sum, steps)."""
    mean = {k: total / max(count, 1) for k, (total, count) in sums.items()}
    fired = [f"{k.removeprefix('signal/fired/')} {v:.0%}" for k, v in mean.items() if k.startswith("signal/fired/")]
    parts = []
    if "signal/reward_nonzero" in mean:
        parts.append(
            f"rewards non-zero {mean['signal/reward_nonzero']:.0%}" + (f" ({', '.join(fired)})" if fired else "")
        )
    if "signal/equal_reward_groups" in mean:
        parts.append(f"prompts whose samples all scored alike {mean['signal/equal_reward_groups']:.0%}")
    if "truncated_fraction" in mean:
        parts.append(f"cut at the token limit {mean['truncated_fraction']:.0%}")
    return ", ".join(parts)


def _duration(seconds: float) -> str:
    """``42 s``, ``12 min``, ``3 h 05 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
