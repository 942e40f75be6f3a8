"""Preparing a run checks what it can before any worker starts; building one releases everything it built when a
later factory fails."""

from pathlib import Path

import pytest

from rl_core.console import RunConsole
from rl_core.errors import ConfigError, InputError, RLCoreError
from rl_core.hookspecs import hookimpl
from rl_core.registry import Registry
from rl_core.run import prepare_run, run_config
from rl_core.specs import RolloutEngineSpec


def prepare(make_config, *overrides: str):
    return prepare_run(make_config("warmup_recipe=null", *overrides), Registry.discover(), RunConsole(progress=False))


def test_a_missing_model_folder_is_named_before_anything_starts(make_config, tmp_path: Path):
    with pytest.raises(InputError, match=r"policy.model_name: no Hugging Face model folder at '.*/no/such/model'"):
        prepare(make_config, f"policy.model_name={tmp_path}/no/such/model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a Hugging Face model folder: it has no config.json"):
        prepare(make_config, f"policy.model_name={tmp_path}/empty")


def test_missing_or_unreadable_data_is_named_before_anything_starts(make_config, tiny_model_path, tmp_path: Path):
    with pytest.raises(ConfigError, match="data file not found: .*/nope.jsonl"):
        prepare(make_config, f"policy.model_name={tiny_model_path}", f"data.train_path={tmp_path}/nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(InputError, match="cannot be read as JSONL"):
        prepare(make_config, f"policy.model_name={tiny_model_path}", f"data.train_path={bad}")
    with pytest.raises(ConfigError, match=r"data.task: must be one of .* \(got 'parrity'\); did you mean 'parity'\?"):
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
    with pytest.raises(RuntimeError, match="engine factory failed on purpose"):
        run_config(config, registry, RunConsole(progress=False))
    left = {k for k, v in ray.util.placement_group_table().items() if v["state"] != "REMOVED"} - before
    assert not left, "the backend built before the failing engine must be shut down (its placement group removed)"


def test_the_core_registers_through_its_entry_point():
    registry = Registry.discover(entry_points=False)
    assert registry.plugins["core"].distribution == "rl-core"
    assert "grpo" in registry.specs("algorithm")
    with pytest.raises(RLCoreError, match="no rollout engine named 'vllm'"):
        registry.get("rollout_engine", "vllm")
