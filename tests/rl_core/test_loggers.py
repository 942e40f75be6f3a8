"""The optional metrics loggers for real, by their own conventions and without a network: W&B offline (its files
in the run folder, the metrics and samples read back from them), MLflow on a SQLite store in the run folder (the
metrics read back through MLflow's client), TensorBoard's event files."""

import json
from pathlib import Path

import pytest

SAMPLES = [
    {"prompt": "Add 2+3.", "turns": [{"role": "model", "text": "<answer>5</answer>"}], "reward": 1.0, "ended": "stop"}
]


def wandb_history(path: Path) -> list[dict]:
    """The history rows of an offline W&B run: its record file is a LevelDB-style log (a 7-byte header, then 32 KiB
    blocks of records, each a 7-byte header: crc32, length, type 1 full / 2 first / 3 middle / 4 last) of wandb's
    own protobuf ``Record`` messages."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", "not a W&B record file"
    pos, pending, rows = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        if length == 0 and kind == 0:
            break
    return rows


def drive(logger) -> None:
    logger.log(1, {"reward": 0.5, "train/loss": 1.25})
    logger.log(2, {"reward": 0.75, "train/loss": 1.0})
    logger.log_samples(2, SAMPLES)
    logger.close()


def test_wandb_logs_offline_into_the_run_folder(make_config, tmp_path: Path, monkeypatch):
    from rl_core.outputs.metrics import WandbLogger

    monkeypatch.delenv("WANDB_MODE", raising=False)
    drive(WandbLogger(make_config("logger.wandb_enabled=true"), tmp_path))
    (run,) = (tmp_path / "wandb").glob("offline-run-*")  # offline by default: nothing left the machine
    history = wandb_history(next(run.glob("run-*.wandb")))
    assert [(h["_step"], h["reward"], h["train/loss"]) for h in history if "reward" in h] == [
        (1, 0.5, 1.25),
        (2, 0.75, 1.0),
    ]
    (table,) = (run / "files" / "media" / "table").glob("samples_2_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"] == ["prompt", "turns", "reward", "ended"] and data["data"][0][0] == "Add 2+3."


def test_mlflow_logs_to_a_sqlite_store_in_the_run_folder(make_config, tmp_path: Path, monkeypatch):
    import mlflow

    from rl_core.outputs.metrics import EXPERIMENT, MlflowLogger

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    drive(MlflowLogger(make_config("logger.mlflow_enabled=true"), tmp_path))
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.25), (2, 1.0)]
    saved = next((tmp_path / "mlartifacts").rglob("step_000002.json"))
    assert json.loads(saved.read_text())["samples"] == SAMPLES
    assert not Path("mlruns").exists() and not Path("mlartifacts").exists(), "nothing written outside the run folder"


def test_tensorboard_writes_event_files_with_scalars_and_samples(make_config, tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rl_core.outputs.metrics import TensorBoardLogger

    drive(TensorBoardLogger(tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward")] == [(1, 0.5), (2, 0.75)]
    assert "samples/text_summary" in events.Tags()["tensors"]


@pytest.mark.parametrize("logger", ["wandb", "mlflow"])
def test_a_logger_follows_its_tools_environment_variable(make_config, tmp_path: Path, monkeypatch, logger):
    """WANDB_MODE and MLFLOW_TRACKING_URI, each tool's own switch, are honoured when the config does not say."""
    if logger == "wandb":
        from rl_core.outputs.metrics import WandbLogger

        monkeypatch.setenv("WANDB_MODE", "disabled")
        drive(WandbLogger(make_config(), tmp_path))
        assert not list((tmp_path / "wandb").glob("offline-run-*")), "disabled: no offline run written"
    else:
        import mlflow

        from rl_core.outputs.metrics import MlflowLogger

        uri = f"sqlite:///{tmp_path / 'elsewhere.db'}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.chdir(tmp_path)  # that store's artifacts go where MLflow puts them by default: ./mlruns
        drive(MlflowLogger(make_config(), tmp_path / "run"))
        client = mlflow.tracking.MlflowClient(uri)
        assert client.search_runs([client.get_experiment_by_name("rl-core").experiment_id])
        assert not (tmp_path / "run" / "mlflow.db").exists()
