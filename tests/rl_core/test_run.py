"""Preparing a run checks what it can before any worker starts; building one releases everything it built when a
later factory fails."""

import re
from pathlib import Path

import pytest

from rl_core.base.errors import ConfigError, InputError, PluginError, RLCoreError
from rl_core.launch.run import prepare_run, run_config
from rl_core.outputs.console import RunConsole
from rl_core.plugins.hookspecs import hookimpl
from rl_core.plugins.registry import Registry
from rl_core.plugins.specs import RolloutEngineSpec


def prepare(make_config, *overrides: str):
    return prepare_run(make_config("warmup_recipe=null", *overrides), Registry.discover(), RunConsole(progress=False))


def test_a_missing_model_folder_is_named_before_anything_starts(make_config, tmp_path: Path):
    with pytest.raises(InputError, match=r"policy.model_name: no Hugging Face model folder at '.*/no/such/model'"):
        prepare(make_config, f"policy.model_name={tmp_path}/no/such/model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a Hugging Face model folder: it has no config.json"):
        prepare(make_config, f"policy.model_name={tmp_path}/empty")


def test_missing_or_unreadable_data_is_named_before_anything_starts(make_config, tiny_model_path, tmp_path: Path):
    with pytest.raises(ConfigError, match=r"data.train_path: no file or folder at .*/nope.jsonl \(a path in a config"):
        prepare(make_config, f"policy.model_name={tiny_model_path}", f"data.train_path={tmp_path}/nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(InputError, match=r"bad.jsonl, line 2: not valid JSON"):
        prepare(make_config, f"policy.model_name={tiny_model_path}", f"data.train_path={bad}")
    with pytest.raises(
        ConfigError,
        match=r"data.task: no task named 'parrity' is installed \(available: .*\)\. Did you mean 'parity'\?",
    ):
        make_config("data.task=parrity")


def test_a_run_folder_that_cannot_be_written_or_is_full_is_named(make_config, tiny_model_path, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(InputError, match="run_dir: cannot write in .*a-file/run"):
        prepare(make_config, f"policy.model_name={tiny_model_path}", f"run_dir={blocker}/run")
    monkeypatch.setattr("shutil.disk_usage", lambda _p: type("U", (), {"free": 1 << 20})())
    with pytest.raises(InputError, match=r"run_dir: .* has 1 MiB free, and a checkpoint of this model needs about"):
        prepare(make_config, f"policy.model_name={tiny_model_path}")


class FailingEngine:
    """An engine plugin whose factory fails: the error path under test."""

    @hookimpl
    def rl_rollout_engines(self):
        def factory(config, section):
            raise RuntimeError("engine factory failed on purpose")

        return [RolloutEngineSpec(name="failing", factory=factory, package="test")]


@pytest.mark.ray
@pytest.mark.slow
def test_a_failing_factory_leaks_no_worker_of_what_was_built(ray_session, make_config, tiny_model_path):
    import ray

    registry = Registry.discover(extra=[("failing", FailingEngine())])
    config = make_config(
        "warmup_recipe=null", f"policy.model_name={tiny_model_path}", "policy.generation.backend=failing"
    )
    before = {k for k, v in ray.util.placement_group_table().items() if v["state"] != "REMOVED"}
    with pytest.raises(
        PluginError, match=r"rollout engine 'failing' \(test\) failed to start: RuntimeError: engine factory failed on"
    ):
        run_config(config, registry, RunConsole(progress=False))
    left = {k for k, v in ray.util.placement_group_table().items() if v["state"] != "REMOVED"} - before
    assert not left, "the backend built before the failing engine must be shut down (its placement group removed)"


class FailingFactories:
    """A reward source and an environment whose factories fail (as a plugin's missing dependency would)."""

    @hookimpl
    def rl_reward_sources(self):
        from rl_core.plugins.specs import RewardSourceSpec

        return [RewardSourceSpec(name="broken", factory=self.fail, package="broken-plugin 0.1")]

    @hookimpl
    def rl_environments(self):
        from rl_core.plugins.specs import EnvironmentSpec

        return [EnvironmentSpec(name="broken_env", factory=self.fail, package="broken-plugin 0.1")]

    @staticmethod
    def fail(options):
        raise ModuleNotFoundError("No module named 'sympy'")


@pytest.mark.parametrize("name", ["broken", "broken_env"])
def test_certify_names_the_component_and_package_whose_factory_fails(name: str, tmp_path: Path):
    from rl_core.certify.command import certify

    registry = Registry.discover(extra=[("broken", FailingFactories())])
    kind = "reward source" if name == "broken" else "environment"
    card = certify(name, registry, work=tmp_path)  # a card that says it, not an abort
    assert not card.passed and len(card.results) == 1, card.results
    assert re.search(rf"{kind} '{name}' \(broken-plugin 0.1\) failed to start: ModuleNotFound", card.results[0].detail)


def test_the_core_registers_through_its_entry_point():
    registry = Registry.discover(entry_points=False)
    assert registry.plugins["core"].distribution == "rl-core"
    assert "grpo" in registry.specs("algorithm")
    with pytest.raises(RLCoreError, match="no rollout engine named 'vllm'"):
        registry.get("rollout_engine", "vllm")


def test_a_second_run_into_a_folder_in_use_is_refused_and_a_finished_one_frees_it(tmp_path: Path):
    from rl_core.launch.folder import run_lock

    with (
        run_lock(tmp_path),
        pytest.raises(InputError, match=rf"run_dir: {tmp_path} is in use by a run still going \(pid \d+\)"),
        run_lock(tmp_path),
    ):
        pass
    with run_lock(tmp_path):  # released when the run ended
        pass


class Record:
    """A console that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warn(self, text: str) -> None:
        self.lines.append(text)


@pytest.mark.parametrize(
    "content",
    ['{"config": "x", "metrics": {"val/reward": 1.0', "garbage", "[1, 2]", '{"config": "x", "metrics": {"a": "1.0"}}'],
    ids=["truncated", "not-json", "not-a-record", "string-metric"],
)
def test_a_complete_json_that_is_not_a_record_is_named_and_ignored(tmp_path: Path, content: str):
    from rl_core.launch.folder import COMPLETE, finished_metrics

    (tmp_path / COMPLETE).write_text(content)
    console = Record()
    assert finished_metrics(tmp_path, "x", console) is None  # the run goes on from its checkpoints
    assert len(console.lines) == 1 and str(tmp_path / COMPLETE) in console.lines[0], console.lines


def test_a_finished_record_counts_for_the_same_run_only(tmp_path: Path, make_config):
    import json

    from rl_core.launch.folder import COMPLETE, finished_metrics, run_identity

    config = make_config("grpo.max_num_steps=4")
    (tmp_path / COMPLETE).write_text(json.dumps({"config": run_identity(config), "metrics": {"val/reward": 1}}))
    same = [
        make_config("grpo.max_num_steps=4", "logger.progress=false"),  # how it is shown
        make_config("grpo.max_num_steps=4", f"run_dir={tmp_path}/run/"),  # how the folder is spelled
        make_config("grpo.max_num_steps=4", "logger.tensorboard_enabled=true"),
    ]
    assert all(finished_metrics(tmp_path, run_identity(c), Record()) == {"val/reward": 1.0} for c in same)
    assert finished_metrics(tmp_path, run_identity(make_config("grpo.max_num_steps=6")), Record()) is None
    assert finished_metrics(tmp_path / "elsewhere", run_identity(config), Record()) is None  # no record: a new run
    (tmp_path / "folder" / COMPLETE).mkdir(parents=True)
    with pytest.raises(InputError, match="is a folder, where rl-core writes the record of a finished run"):
        finished_metrics(tmp_path / "folder", run_identity(config), Record())


def test_a_run_folder_past_the_steps_asked_for_is_refused_before_anything_starts(make_config, tmp_path: Path):
    """A folder checkpointed at step 6, asked for 4 steps: refused from the checkpoints on disk, before the run's
    warm-up or any worker (the config's model does not even exist); a damaged step 6 is not a reason to refuse."""
    from rl_core.base.schema import CheckpointingConfig
    from rl_core.outputs.checkpoint import CheckpointManager

    config = make_config("grpo.max_num_steps=4", f"policy.model_name={tmp_path}/no/such/model")
    checkpoints = CheckpointManager(Path(config.run_dir), CheckpointingConfig(keep_top_k=None))
    for step in (2, 6):
        checkpoints.save(step, {"step": step}, lambda p: (p.mkdir(), (p / "w.bin").write_bytes(b"w")), "")
    with pytest.raises(InputError, match=r"checkpointed at step 6, past the 4 steps this config asks for"):
        run_config(config, Registry.discover(), RunConsole(progress=False))
    (checkpoints.root / "step_000006" / "policy" / "w.bin").write_bytes(b"damaged")
    with pytest.raises(InputError, match=r"policy.model_name: no Hugging Face model folder"):  # it goes on
        run_config(config, Registry.discover(), RunConsole(progress=False))


def test_a_damaged_weights_file_is_named_before_anything_starts(make_config, tiny_model_path, tmp_path: Path):
    import shutil

    damaged = tmp_path / "model"
    shutil.copytree(tiny_model_path, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(InputError, match=r"policy.model_name: .*model.safetensors is damaged .*write the model folder"):
        prepare(make_config, f"policy.model_name={damaged}")


def test_an_enabled_logger_whose_package_is_missing_is_named_before_anything_starts(make_config, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(
        InputError, match=r"logger.wandb_enabled is on, but wandb is not installed: pip install 'rl-core\[wandb\]'"
    ):
        prepare(make_config, "logger.wandb_enabled=true")


def test_lengths_beyond_the_model_or_the_sequence_are_named_before_anything_starts(make_config, tiny_model_path):
    model = f"policy.model_name={tiny_model_path}"
    with pytest.raises(
        ConfigError, match=r"policy.max_total_sequence_length \(2048\) is more than the model's context \(1024"
    ):
        prepare(make_config, model, "policy.max_total_sequence_length=2048")
    with pytest.raises(ConfigError, match=r"policy.generation.max_new_tokens \(600\) leaves no room for a prompt"):
        prepare(make_config, model, "policy.max_total_sequence_length=512", "policy.generation.max_new_tokens=600")


def test_the_backend_and_the_engine_start_together_and_a_failed_start_releases_the_other():
    """Their starts overlap (each waits for the other here: one after the other, the first would time out); when
    one fails, the other still finishes starting and is shut down with the run's stack, and the failure is raised."""
    import contextlib
    import threading

    from rl_core.launch.components import owned, start_all

    both = threading.Barrier(2, timeout=10)
    stopped: list[str] = []

    class Component:
        def __init__(self, name: str) -> None:
            both.wait()  # BrokenBarrierError after 10 s unless the other start runs at the same time
            self.name = name

        def shutdown(self) -> None:
            stopped.append(self.name)

    with contextlib.ExitStack() as stack:
        got = start_all({n: owned(stack, lambda n=n: Component(n)) for n in ("backend", "engine")}, together=True)
        assert {n: c.name for n, c in got.items()} == {"backend": "backend", "engine": "engine"}
    assert sorted(stopped) == ["backend", "engine"]

    def broken() -> Component:
        both.wait()
        raise RuntimeError("the engine's model does not load")

    stopped.clear()
    with pytest.raises(RuntimeError, match="does not load"), contextlib.ExitStack() as stack:
        start_all({"backend": owned(stack, lambda: Component("backend")), "engine": broken}, together=True)
    assert stopped == ["backend"]
    # colocated on GPUs: one after the other, in order
    order: list[str] = []
    start_all({n: (lambda n=n: order.append(n)) for n in ("backend", "critic", "engine")}, together=False)
    assert order == ["backend", "critic", "engine"]
