"""Metrics loggers: JSONL always; TensorBoard, W&B (offline works without a network) and MLflow (a SQLite store in
the run folder by default) when enabled. All implement ``rl_core.contracts.protocols.MetricsLogger``."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.base.schema import Config, to_dict


def _clean(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        value = float(value)
        out[key] = value if math.isfinite(value) else float("nan")
    return out


class JsonlLogger:
    """One JSON object per step in ``RUN_DIR/metrics.jsonl``: ``{"step": N, ...metrics}``."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a")

    def resume(self, step: int) -> None:
        """Drop the rows after ``step`` (written by a run that was killed after its last checkpoint; ``-1``: every
        row, for a run that starts from step 0 again), so that each step appears once."""
        self._file.close()
        kept = [line for line in self.path.read_text().splitlines(keepends=True) if _step_of(line) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        tmp.replace(self.path)
        self._file = self.path.open("a")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **_clean(metrics)}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _step_of(line: str) -> float:
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")  # a half-written last line: dropped


class TensorBoardLogger:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in _clean(metrics).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        self.writer.add_text("samples", "\n\n".join(f"    {json.dumps(r)}" for r in rows), step)

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Weights & Biases, by its own conventions: ``WANDB_MODE`` and the login (``WANDB_API_KEY``) as wandb reads
    them, unless ``logger.wandb_mode`` says otherwise; with neither, offline (the run syncs later with
    ``wandb sync RUN_DIR/wandb/offline-run-*``). Its files go under ``RUN_DIR/wandb``."""

    def __init__(self, config: Config, run_dir: Path) -> None:

        import wandb

        mode: Any = config.logger.wandb_mode or os.environ.get("WANDB_MODE") or "offline"
        self.run = wandb.init(
            project=config.logger.wandb_project,
            mode=mode,
            dir=str(run_dir),
            config=to_dict(config),
            name=run_dir.name,
            settings=wandb.Settings(silent=True),
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(_clean(metrics), step=step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        import wandb

        table = wandb.Table(columns=["prompt", "turns", "reward", "ended"])
        for r in rows:
            table.add_data(r["prompt"], json.dumps(r["turns"]), r["reward"], r["ended"])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # wandb's service process writes the run's record file behind finish(); its teardown waits for it, so the
        # run folder is complete when the run ends (not only at interpreter exit, which a killed process skips)
        wandb.teardown()


class MlflowLogger:
    """MLflow, by its own conventions: the tracking server of ``logger.mlflow_tracking_uri`` or
    ``MLFLOW_TRACKING_URI``; with neither, a SQLite store in the run folder (``RUN_DIR/mlflow.db``, artifacts in
    ``RUN_DIR/mlartifacts``; MLflow 3 refuses its old file store). Metric names use ``_`` for ``/``."""

    def __init__(self, config: Config, run_dir: Path) -> None:

        import mlflow

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no database set-up chatter on the terminal
        uri = config.logger.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(uri or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
        if uri is None and mlflow.get_experiment_by_name(EXPERIMENT) is None:
            mlflow.create_experiment(EXPERIMENT, artifact_location=(run_dir / "mlartifacts").resolve().as_uri())
        mlflow.set_experiment(EXPERIMENT)
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=run_dir.name)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        clean = {k.replace("/", "_"): v for k, v in _clean(metrics).items()}
        self.mlflow.log_metrics(clean, step=step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        self.mlflow.log_dict({"step": step, "samples": list(rows)}, f"samples/step_{step:06d}.json")

    def close(self) -> None:
        self.mlflow.end_run()


#: the MLflow experiment runs are logged to
EXPERIMENT = "rl-core"


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """The rows of ``RUN_DIR/metrics.jsonl``, one per step (the last one, should a step appear twice)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    by_step: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_step[int(row["step"])] = row
    return [by_step[k] for k in sorted(by_step)]
