"""Certifying an algorithm loop (a core one or an outside plugin's): two steps on the default recipe over the tiny
model, a checkpoint after each, then the same run resumed from its step-1 checkpoint. An algorithm built from the
core's pieces (``run_loop`` and the rollout helpers) passes; one that logs non-finite metrics, skips steps, writes
no checkpoint, or does not come back from one to the same step fails the check that says so."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

import attrs
from rich.console import Console

from rl_core.certify.card import Card, Outcome
from rl_core.config.loader import load_config
from rl_core.launch.folder import COMPLETE
from rl_core.launch.run import run_config
from rl_core.outputs.console import RunConsole
from rl_core.plugins.registry import Registry
from rl_core.plugins.specs import AlgorithmSpec

#: the steps a certify run trains
STEPS = 2
#: metrics that measure the machine (time, memory), not training: left out when a resumed step is compared with the
#: uninterrupted one
_TIMING = ("time/", "seconds", "per_second", "throughput", "peak_memory", "startup/")


@attrs.frozen(kw_only=True)
class AlgorithmCase:
    spec: AlgorithmSpec
    registry: Registry
    overrides: tuple[str, ...]
    work: Path

    def run(self, name: str) -> Path:
        """Run (or resume) the certify config in ``work/name``; the run folder."""
        run_dir = self.work / name
        config = load_config(None, [f"run_dir={run_dir}", *self.overrides], self.registry)
        # the runs' lines on stderr: stdout is the card's (``--json`` included)
        run_config(config, self.registry, RunConsole(Console(stderr=True), progress=False), summary=False)
        return run_dir


def certify_algorithm(
    spec: AlgorithmSpec, registry: Registry, work: Path, *, overrides: Sequence[str] = (), card: Card | None = None
) -> Card:
    """Certify the algorithm ``spec`` over ``STEPS`` steps. ``overrides``: config overrides (``key=value``) for its
    run, after certify's own (no warm-up, a checkpoint every step, the section's ``max_num_steps`` when it has
    one)."""
    card = card or Card("algorithm", spec.name)
    own = [
        f"algorithm={spec.name}",
        "warmup_recipe=null",
        "checkpointing.save_period=1",
        "checkpointing.keep_top_k=null",
    ]
    if spec.config_key and spec.config_class is not None and "max_num_steps" in attrs.fields_dict(spec.config_class):
        own.append(f"{spec.config_key}.max_num_steps={STEPS}")
    case = AlgorithmCase(spec=spec, registry=registry, overrides=(*own, *overrides), work=work)
    rows: dict[int, dict[str, float]] = {}
    card.run(f"{STEPS} steps run, each logs finite metrics", "rows 1..2, all finite", partial(check_steps, case, rows))
    card.run("a checkpoint after every step, the final policy exported", "all there", partial(check_outputs, case))
    card.run(
        "resumed from the step-1 checkpoint, step 2's metrics are the same, its checkpoint and final/ saved",
        "equal (timings aside)",
        partial(check_resume, case, rows),
    )
    return card


def _rows(run_dir: Path) -> dict[int, dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    out: dict[int, dict[str, float]] = {}
    for row in map(json.loads, lines):
        out.setdefault(int(row["step"]), {}).update(row)
    return out


def check_steps(case: AlgorithmCase, rows: dict[int, dict[str, float]]) -> Outcome:
    rows.update(_rows(case.run("straight")))
    steps = sorted(s for s in rows if s > 0)
    bad = sorted({k for s in steps for k, v in rows[s].items() if not math.isfinite(float(v))})
    ok = steps == list(range(1, STEPS + 1)) and not bad
    return ok, f"steps {steps}", f"non-finite: {', '.join(bad)}" if bad else ""


def check_outputs(case: AlgorithmCase) -> Outcome:
    run_dir = case.work / "straight"
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    expected = [f"step_{s:06d}" for s in range(1, STEPS + 1)]
    final = (run_dir / "final" / "config.json").is_file()
    return saved == expected and final, f"{saved}, final {'yes' if final else 'missing'}"


def check_resume(case: AlgorithmCase, rows: Mapping[int, Mapping[str, float]]) -> Outcome:
    """The straight run's folder as a run killed after step 1 leaves it, run again: it resumes, trains step 2 to
    the same metrics, and saves step 2's checkpoint and ``final/`` again."""
    killed = case.work / "resumed"
    shutil.copytree(case.work / "straight", killed)
    later = (killed / "checkpoints" / f"step_{STEPS:06d}", killed / "final", killed / COMPLETE)
    for path in later:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    again = _rows(case.run("resumed")).get(STEPS, {})
    want = rows.get(STEPS, {})
    keys = sorted(k for k in want if not any(t in k for t in _TIMING))
    differ = [k for k in keys if not math.isclose(float(again.get(k, math.nan)), float(want[k]), rel_tol=1e-6)]
    missing = [str(p.relative_to(killed)) for p in later[:2] if not p.is_dir()]
    ok = not differ and bool(keys) and not missing
    saved = f"{', '.join(missing)} not saved" if missing else f"{later[0].name} and final/ back"
    return ok, f"{len(keys) - len(differ)}/{len(keys)} equal; {saved}", ", ".join(differ)[:300]
