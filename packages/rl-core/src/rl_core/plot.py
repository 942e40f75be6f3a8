"""``rl-core plot RUN_DIR``: reward, KL, loss and per-phase time curves from ``metrics.jsonl`` to one PNG."""

from __future__ import annotations

from pathlib import Path

from rl_core.errors import InputError
from rl_core.metrics import read_metrics

#: PNG size in pixels (width, height).
SIZE = (1600, 1000)
DPI = 100


def plot_run(run_dir: Path, output: Path | None = None) -> Path:
    rows = read_metrics(run_dir)
    if not rows:
        raise InputError(f"{run_dir} has no metrics.jsonl rows to plot; is it a run folder?")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(SIZE[0] / DPI, SIZE[1] / DPI), dpi=DPI)
    panels = [
        ("reward", ["reward", "val/reward"]),
        ("KL to reference", ["train/kl"]),
        ("loss", ["train/loss", "val/loss"]),
        ("seconds per phase", sorted({k for r in rows for k in r if k.startswith("time/") and k != "time/step"})),
    ]
    for ax, (title, keys) in zip(axes.flat, panels, strict=True):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if key in r]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    out = output or Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out
