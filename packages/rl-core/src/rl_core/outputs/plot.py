"""``rl-core plot RUN_DIR``: reward, KL, loss, learning-signal and per-phase time curves from ``metrics.jsonl`` to one
PNG.

Only the panels with something logged are drawn; validation metrics (``val/...``, logged every few steps) are
points, training metrics lines with points."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.base.errors import InputError
from rl_core.outputs.metrics import read_metrics

#: PNG size in pixels (width, height).
SIZE = (1600, 1000)
DPI = 100

#: (title, metric keys) of every panel that can be drawn; a key ending in ``/`` stands for every logged key under
#: it; the phase-time keys are found in the rows.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward", "val/reward")),
    ("KL to reference", ("train/kl",)),
    ("loss", ("train/loss", "val/loss")),
    (
        "learning signal (shares)",
        (
            "truncated_fraction",
            "signal/equal_reward_groups",
            "signal/reward_nonzero",
            "signal/length_of_limit",
            "signal/fired/",
        ),
    ),
    ("seconds per phase", ()),
)


def panels(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """The panels worth drawing for ``rows``: each with the keys that some row logged."""
    logged = {k for r in rows for k in r}
    times = sorted(k for k in logged if k.startswith("time/") and k != "time/step")
    out = []
    for title, keys in PANELS:
        present = [k for key in keys for k in _logged(key, logged)] if keys else times
        if present:
            out.append((title, present))
    return out


def _logged(key: str, logged: set[str]) -> list[str]:
    """``key`` if it was logged; for a key ending in ``/``, every logged key under it."""
    if key.endswith("/"):
        return sorted(k for k in logged if k.startswith(key))
    return [key] if key in logged else []


def plot_run(run_dir: Path, output: Path | None = None) -> Path:
    rows = read_metrics(run_dir)
    if not rows:
        raise InputError(f"{run_dir} has no metrics.jsonl rows to plot; is it a run folder?")
    drawn = panels(rows)
    if not drawn:
        raise InputError(f"{run_dir}/metrics.jsonl has no reward, KL, loss or time metric to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 1 if len(drawn) == 1 else 2
    fig, axes = plt.subplots(
        math.ceil(len(drawn) / columns), columns, figsize=(SIZE[0] / DPI, SIZE[1] / DPI), dpi=DPI, squeeze=False
    )
    for ax, (title, keys) in zip(axes.flat, drawn, strict=False):
        for key in keys:
            xs = [r["step"] for r in rows if key in r]
            ys = [r[key] for r in rows if key in r]
            style = {"linestyle": "none", "markersize": 6} if key.startswith("val/") else {"markersize": 3}
            ax.plot(xs, ys, marker="o", label=key, **style)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(drawn) :]:
        ax.set_visible(False)
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    out = output or Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out
