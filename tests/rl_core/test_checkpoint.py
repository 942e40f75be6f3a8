"""Atomic checkpoints and keep_top_k."""

import json
from pathlib import Path

import pytest

from rl_core.base.schema import CheckpointingConfig
from rl_core.outputs.checkpoint import CheckpointError, CheckpointManager, atomic_folder


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


def corrupt(kind: str, folder: Path) -> None:
    if kind == "truncated shard":
        weights = folder / "policy" / "weights.bin"
        weights.write_bytes(weights.read_bytes()[:-1])
    elif kind == "half state.json":
        state = folder / "state.json"
        state.write_text(state.read_text()[: len(state.read_text()) // 2])
    elif kind == "missing file":
        (folder / "config.yaml").unlink()
    elif kind == "flipped byte":
        weights = folder / "policy" / "weights.bin"
        data = bytearray(weights.read_bytes())
        data[0] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif kind == "no manifest":
        (folder / "manifest.json").unlink()


@pytest.mark.parametrize("kind", ["truncated shard", "half state.json", "missing file", "flipped byte", "no manifest"])
def test_a_corrupted_latest_checkpoint_falls_back_to_the_previous_whole_one(tmp_path: Path, kind: str):
    mgr = CheckpointManager(tmp_path, CheckpointingConfig(keep_top_k=None))

    def policy(path: Path) -> None:
        path.mkdir()
        (path / "weights.bin").write_bytes(bytes(range(256)) * 64)

    mgr.save(2, {"data_position": 16}, policy, "seed: 1\n")
    mgr.save(4, {"data_position": 32}, policy, "seed: 1\n")
    corrupt(kind, tmp_path / "checkpoints" / "step_000004")
    skipped: list[str] = []
    latest = mgr.latest(skipped.append)
    assert latest is not None and latest.step == 2 and latest.state["data_position"] == 16
    assert len(skipped) == 1 and skipped[0].startswith("checkpoint step_000004 skipped: "), skipped


def test_a_failed_save_leaves_nothing_and_names_a_full_disk(tmp_path: Path, monkeypatch):
    mgr = CheckpointManager(tmp_path, CheckpointingConfig())

    def full_disk(path: Path) -> None:
        path.mkdir()
        (path / "part").write_bytes(b"x" * 10)
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointError, match=r"checkpoint of step 3 not written to .*: no space left on device"):
        mgr.save(3, {}, full_disk, "")
    assert not list((tmp_path / "checkpoints").iterdir()), "the half-written checkpoint is removed"

    def broken(path: Path) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr("shutil.disk_usage", lambda _p: type("U", (), {"free": 10 * 2**20})())
    with pytest.raises(CheckpointError, match="no space left on device \\(10.0 MiB free"):
        mgr.save(3, {}, broken, "")  # a cryptic writer error on an almost full disk is named as a full disk


def test_an_export_is_whole_or_absent(tmp_path: Path):
    final = tmp_path / "final"
    with pytest.raises(RuntimeError), atomic_folder(final) as tmp:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("killed mid-export")
    assert not final.exists() and not list(tmp_path.glob(".tmp-*"))
    with atomic_folder(final) as tmp:
        (tmp / "config.json").write_text('{"v": 1}')
    with atomic_folder(final) as tmp:
        (tmp / "config.json").write_text('{"v": 2}')
    assert json.loads((final / "config.json").read_text()) == {"v": 2} and len(list(tmp_path.iterdir())) == 1


def test_resume_drops_the_metrics_logged_after_the_checkpoint(tmp_path: Path):
    from rl_core.outputs.metrics import JsonlLogger

    logger = JsonlLogger(tmp_path)
    for step in range(6):
        logger.log(step, {"reward": float(step)})
    logger.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "rew')  # a line cut by the kill
    resumed = JsonlLogger(tmp_path)
    resumed.resume(4)
    resumed.log(5, {"reward": 50.0})
    resumed.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5] and rows[-1]["reward"] == 50.0
