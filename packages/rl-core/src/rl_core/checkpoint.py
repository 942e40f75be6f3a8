"""Checkpoints in the run folder, written atomically and pruned to the best ``keep_top_k``.

A checkpoint is ``RUN_DIR/checkpoints/step_000010/`` holding ``policy/`` (the backend's own format),
``state.json`` (step, metrics, data position, RNG) and ``config.yaml``. It is written under a temporary name and
renamed when complete, so a run killed mid-write leaves only a ``.tmp`` folder that is ignored and removed.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from rl_core.config import CheckpointingConfig

log = logging.getLogger(__name__)
_NAME = re.compile(r"^step_(\d{6,})$")


@attrs.frozen(kw_only=True)
class Checkpoint:
    step: int
    path: Path
    state: Mapping[str, Any]

    @property
    def policy_dir(self) -> Path:
        return self.path / "policy"


class CheckpointManager:
    def __init__(self, run_dir: Path, cfg: CheckpointingConfig) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.cfg = cfg

    def complete(self) -> list[Checkpoint]:
        """Complete checkpoints, oldest first. Half-written ones (``.tmp``) are never listed."""
        out = []
        if not self.root.is_dir():
            return out
        for path in self.root.iterdir():
            m = _NAME.match(path.name)
            state_file = path / "state.json"
            if m and path.is_dir() and state_file.is_file():
                out.append(Checkpoint(step=int(m.group(1)), path=path, state=json.loads(state_file.read_text())))
        return sorted(out, key=lambda c: c.step)

    def latest(self) -> Checkpoint | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, step: int, state: Mapping[str, Any], write_policy: Callable[[Path], None], config_yaml: str) -> Path:
        """Write a checkpoint atomically: everything into a temporary folder, then one rename."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step:06d}-", dir=self.root))
        write_policy(tmp / "policy")
        (tmp / "config.yaml").write_text(config_yaml)
        (tmp / "state.json").write_text(json.dumps(dict(state), indent=1))
        final = self.root / f"step_{step:06d}"
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        self._prune()
        return final

    def _prune(self) -> None:
        keep = self.cfg.keep_top_k
        done = self.complete()
        if keep is None or len(done) <= keep:
            return
        latest = done[-1]
        metric = self.cfg.metric_name

        def score(c: Checkpoint) -> float:
            value = c.state.get("metrics", {}).get(metric) if metric else None
            if value is None:
                return float(c.step)  # no metric: keep the newest
            return float(value) if self.cfg.higher_is_better else -float(value)

        ranked = sorted(done, key=lambda c: (score(c), c.step), reverse=True)
        keep_set = {c.path for c in ranked[:keep]} | {latest.path}
        for c in done:
            if c.path not in keep_set:
                log.info("removing checkpoint %s (not in the top %d by %s)", c.path.name, keep, metric)
                shutil.rmtree(c.path, ignore_errors=True)
