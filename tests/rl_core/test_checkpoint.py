"""Atomic checkpoints and keep_top_k."""

import json
from pathlib import Path

from rl_core.checkpoint import CheckpointManager
from rl_core.schema import CheckpointingConfig


def write_policy(path: Path) -> None:
    path.mkdir()
    (path / "weights.bin").write_bytes(b"x")


def test_half_written_checkpoints_are_never_used(tmp_path: Path):
    mgr = CheckpointManager(tmp_path, CheckpointingConfig())
    mgr.save(2, {"data_position": 16}, write_policy, "seed: 1\n")
    # what a kill leaves: a temporary folder mid-write, and a folder without its state file
    (tmp_path / "checkpoints" / ".tmp-step_000004-abc" / "policy").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000006" / "policy").mkdir(parents=True)
    latest = mgr.latest()
    assert latest is not None and latest.step == 2 and latest.state["data_position"] == 16
    mgr.save(4, {}, write_policy, "")
    assert not list((tmp_path / "checkpoints").glob(".tmp-*")), "stale temporary folders are cleaned up"
    assert mgr.latest().step == 4


def test_keep_top_k_by_metric_always_keeps_the_latest(tmp_path: Path):
    mgr = CheckpointManager(tmp_path, CheckpointingConfig(keep_top_k=2, metric_name="val/reward"))
    for step, reward in [(1, 0.5), (2, 0.9), (3, 0.1), (4, 0.7), (5, 0.2)]:
        mgr.save(step, {"metrics": {"val/reward": reward}}, write_policy, "")
    kept = [c.step for c in mgr.complete()]
    assert kept == [2, 4, 5]  # the best two by reward, and the latest
    state = json.loads((tmp_path / "checkpoints" / "step_000002" / "state.json").read_text())
    assert state["metrics"]["val/reward"] == 0.9
