"""A warm-up model built once on a machine is reused by the next run with the same recipe, model, seed and code:
the copy is the model a rebuild gives, byte for byte; anything that makes another model makes another key."""

from pathlib import Path

import pytest

from rl_core.config.loader import load_config
from rl_core.launch import warmup_cache
from rl_core.launch.run import prepare_run
from rl_core.outputs.console import RunConsole

pytestmark = [pytest.mark.ray, pytest.mark.slow]

WARMUP = """\
algorithm: sft
seed: 1
policy:
  model_name: tiny:qwen2-tiny
  train_global_batch_size: 16
  train_micro_batch_size: 16
  max_total_sequence_length: 64
  optimizer: {lr: 3.0e-3}
data: {task: parity_format, num_train: 64, num_val: 16}
sft: {max_num_steps: 2, val_period: 2}
checkpointing: {enabled: false}
"""


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_warmup_built_before_is_reused_as_a_rebuild_would_make_it(
    ray_session, rl_registry, tmp_path: Path, monkeypatch, capsys
):
    monkeypatch.setenv("RL_CORE_CACHE", str(tmp_path / "cache"))
    recipe = tmp_path / "warmup.yaml"
    recipe.write_text(WARMUP)

    def prepare(name: str, *overrides: str) -> str:
        config = load_config(
            None,
            [f"run_dir={tmp_path / name}", f"warmup_recipe={recipe}", "logger.progress=false", *overrides],
            rl_registry,
        )
        capsys.readouterr()
        prepare_run(config, rl_registry, RunConsole(progress=False))
        return " ".join(capsys.readouterr().out.split())

    said = prepare("uncached", "warmup_cache=false")
    assert "warm-up done" in said and not (tmp_path / "cache" / "warmups").exists()
    # the warm-up runs where the run runs: its recipe's cluster section is the run's (a Ray cluster's address)
    said = prepare("first", "cluster.cpus_per_node=6")
    assert "warm-up done" in said and len(list((tmp_path / "cache" / "warmups").iterdir())) == 1
    assert "cpus_per_node: 6" in (tmp_path / "first" / "warmup" / "config.yaml").read_text()
    said = prepare("second", "cluster.cpus_per_node=6")
    assert "built before on this machine" in said and "warm-up done" not in said, said
    rebuilt = files(tmp_path / "uncached" / "warmup" / "final")
    assert files(tmp_path / "first" / "warmup" / "final") == rebuilt  # the warm-up is deterministic
    assert files(tmp_path / "second" / "warmup" / "final") == rebuilt


def test_what_makes_another_warmup_makes_another_key(rl_registry, tmp_path: Path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")

    def key(*overrides: str) -> str:
        config = load_config(None, [f"policy.model_name={model}", *overrides], rl_registry)
        return warmup_cache.warmup_key(config, rl_registry)

    base = key()
    assert key() == base
    assert key("run_dir=elsewhere", "logger.progress=false") == base, "where it runs and how it shows are not in it"
    assert key("seed=7") != base and key("policy.optimizer.lr=0.5") != base
    (model / "config.json").write_text('{"changed": true}')
    assert key() != base, "the base model's files are in it"
    changed = key()
    real = warmup_cache._source_digest
    monkeypatch.setattr(warmup_cache, "_source_digest", lambda folder: real(folder) + "edited")
    assert key() != changed, "the code is in it"
