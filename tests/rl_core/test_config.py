"""Config loading: YAML inheritance, typed overrides, unknown keys with suggestions, plugin sections."""

from pathlib import Path

import pytest

from rl_core.base.errors import ConfigError, PluginError
from rl_core.base.schema import dump_yaml
from rl_core.config.loader import apply_overrides, load_config, parse_override, read_yaml
from rl_core.plugins.registry import Registry


@pytest.fixture(scope="module")
def reg():
    return Registry.discover()


def test_misspelt_key_names_the_key_and_suggests(reg):
    with pytest.raises(
        ConfigError, match=r"unknown config key 'grpo.num_prompt_per_step'; did you mean 'grpo.num_prompts_per_step'\?"
    ):
        load_config(None, ["grpo.num_prompt_per_step=4"], reg)
    with pytest.raises(ConfigError, match=r"'policy.dtensor_cgf'; did you mean 'policy.dtensor_cfg'"):
        load_config(None, ["policy.dtensor_cgf.enabled=true"], reg)
    with pytest.raises(
        ConfigError,
        match=r"'policy.dtensor_cfg.activation_checkpoint'; did you mean 'policy.dtensor_cfg.activation_checkpointing'",
    ):
        load_config(None, ["policy.dtensor_cfg.activation_checkpoint=true"], reg)


def test_overrides_are_typed():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=True") == (["a"], True)
    assert parse_override("a=1e-5") == (["a"], 1e-5)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a=hello") == (["a"], "hello")
    with pytest.raises(ConfigError, match="dotted.key=value"):
        parse_override("novalue")
    assert apply_overrides({"a": {"b": 1}}, ["a.c.d=2"]) == {"a": {"b": 1, "c": {"d": 2}}}


def test_override_values_reach_the_classes(reg):
    cfg = load_config(
        None,
        ["policy.optimizer.lr=1e-5", "policy.generation.stop_token_ids=[1, 2]", "policy.megatron_cfg.enabled=True"],
        reg,
    )
    assert cfg.policy.optimizer.lr == 1e-5
    assert cfg.policy.generation.stop_token_ids == (1, 2)
    assert cfg.section("policy.megatron_cfg").enabled is True


def test_defaults_inheritance_and_cycles(tmp_path: Path):
    (tmp_path / "base.yaml").write_text("seed: 1\npolicy: {model_name: m, train_micro_batch_size: 2}\n")
    (tmp_path / "child.yaml").write_text("defaults: base.yaml\npolicy: {train_micro_batch_size: 4}\n")
    assert read_yaml(tmp_path / "child.yaml") == {"seed": 1, "policy": {"model_name": "m", "train_micro_batch_size": 4}}
    (tmp_path / "a.yaml").write_text("defaults: b.yaml\n")
    (tmp_path / "b.yaml").write_text("defaults: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        read_yaml(tmp_path / "a.yaml")


def test_type_and_value_errors_name_the_key(reg):
    with pytest.raises(ConfigError, match=r"grpo.num_prompts_per_step"):
        load_config(None, ["grpo.num_prompts_per_step=many"], reg)
    with pytest.raises(ConfigError, match="must be a multiple of"):
        load_config(None, ["policy.train_global_batch_size=10", "policy.train_micro_batch_size=4"], reg)
    with pytest.raises(ConfigError, match="ratio_clip_c must be > 1"):
        load_config(None, ["loss_fn.ratio_clip_c=0.5"], reg)
    # cattrs alone reads any string as bool(text): "maybe" and a quoted "false" were True
    for text in ("maybe", "'false'", "1"):
        with pytest.raises(ConfigError, match=r"policy.dtensor_cfg.shared_prefix.*must be true or false"):
            load_config(None, [f"policy.dtensor_cfg.shared_prefix={text}"], reg)


def test_missing_model_and_unknown_reward_source(reg, tmp_path: Path):
    (tmp_path / "c.yaml").write_text("algorithm: sft\n")
    with pytest.raises(ConfigError, match="policy.model_name is required"):
        load_config(tmp_path / "c.yaml", [], reg)
    with pytest.raises(ConfigError, match=r"reward.sources\[0\].name: no reward source named 'nope'"):
        load_config(None, ["reward.sources=[{name: nope}]"], reg)
    with pytest.raises(ConfigError, match=r"unknown config key 'reward.sources\[0\].\w*answer_keyy'"):
        load_config(None, ["reward.sources=[{name: exact_match, answer_keyy: x}]"], reg)


def test_enabled_section_of_a_disabled_plugin_is_an_error(monkeypatch):
    monkeypatch.setenv("RL_CORE_DISABLE_PLUGINS", "megatron")
    reg = Registry.discover()
    with pytest.raises(
        ConfigError, match="policy.megatron_cfg.enabled is true, but .*disabled by RL_CORE_DISABLE_PLUGINS"
    ):
        load_config(None, ["policy.megatron_cfg.enabled=true"], reg)


def test_resolved_config_round_trips(reg, tmp_path: Path):
    cfg = load_config(None, ["grpo.max_num_steps=3", "policy.dtensor_cfg.sequence_packing=true"], reg)
    (tmp_path / "resolved.yaml").write_text(dump_yaml(cfg))
    again = load_config(tmp_path / "resolved.yaml", [], reg)
    assert again == cfg


def test_selection_from_config(reg):
    from rl_core.plugins.selection import select

    both = load_config(None, ["policy.megatron_cfg.enabled=True", "policy.dtensor_cfg.enabled=True"], reg)
    assert (
        select(both, reg, "cpu").backend.describe()
        == "training backend: megatron (priority 200; also enabled: dtensor 100)"
    )
    named = load_config(None, ["policy.megatron_cfg.enabled=True", "policy.backend=dtensor"], reg)
    assert select(named, reg, "cpu").backend.chosen.name == "dtensor"
    none = load_config(None, ["policy.dtensor_cfg.enabled=False"], reg)
    with pytest.raises(PluginError, match="no training backend is enabled"):
        select(none, reg, "cpu")
