"""The registry itself: duplicates, broken plugins, selection by priority. Fake plugins are fine here: the
registry's own logic is under test (the real third-party discovery is in test_third_party_plugin.py)."""

import argparse

import attrs
import pytest

from rl_core.base.errors import ConfigError, PluginError
from rl_core.plugins.hookspecs import hookimpl
from rl_core.plugins.registry import Registry
from rl_core.plugins.selection import choose
from rl_core.plugins.specs import TrainingBackendSpec


@attrs.frozen(kw_only=True)
class Section:
    enabled: bool = False


def backend_plugin(name: str, priority: int, key: str):
    class Plugin:
        @hookimpl
        def rl_training_backends(self):
            return [
                TrainingBackendSpec(name=name, priority=priority, config_key=key, config_class=Section, factory=object)
            ]

    return Plugin()


class Broken:
    @hookimpl
    def rl_training_backends(self):
        raise RuntimeError("boom at registration")


def test_duplicate_names_are_an_error_naming_both():
    with pytest.raises(PluginError, match=r"'x' is registered twice: by a 0 \(plugin 'a'\) and by b 0 \(plugin 'b'\)"):
        Registry.discover(
            entry_points=False, extra=[("a", backend_plugin("x", 1, "p.a")), ("b", backend_plugin("x", 2, "p.b"))]
        )


def test_rl_core_plugins_lists_clashing_plugins_where_other_commands_stop(capsys):
    """The clash's message says "rl-core plugins lists what is installed": so that command lists the clashing
    plugin as a conflict (with the message) and keeps the first one's components, where a run stops."""
    from rl_core.cli import cmd_plugins, plugins_report

    plugins = [("a", backend_plugin("x", 1, "p.a")), ("b", backend_plugin("x", 2, "p.b"))]
    reg = Registry.discover(entry_points=False, extra=plugins, lenient=True)
    rows = {row["plugin"]: row for row in plugins_report(reg)}
    assert rows["a"]["status"] == "loaded" and rows["b"]["status"] == "conflict", rows
    assert "'x' is registered twice" in rows["b"]["error"] and not rows["b"]["components"]
    assert reg.get("training_backend", "x").priority == 1 and reg.pm.get_plugin("b") is None
    twin = Registry.discover(entry_points=False, extra=[("t", backend_plugin("y", 1, "p.y"))], lenient=True)
    twin._add("t", backend_plugin("z", 1, "p.z"), "t-fork", "2")
    assert (
        twin.plugins["t (t-fork)"].status == "conflict"
        and "two plugins are named 't'" in twin.plugins["t (t-fork)"].error
    )
    cmd_plugins(argparse.Namespace(explain=None, json=False), reg)
    assert "conflict" in capsys.readouterr().out


def test_plugin_failing_at_registration_is_skipped_and_reported():
    reg = Registry.discover(entry_points=False, extra=[("bad", Broken()), ("good", backend_plugin("g", 5, "p.g"))])
    assert reg.plugins["bad"].status == "failed" and "boom" in reg.plugins["bad"].error
    assert "g" in reg.specs("training_backend")
    with pytest.raises(PluginError, match="failed to import: RuntimeError"):
        reg.get("training_backend", "bad")


def test_selection_by_priority_and_explicit_override():
    reg = Registry.discover(
        entry_points=False, extra=[("lo", backend_plugin("lo", 100, "p.lo")), ("hi", backend_plugin("hi", 200, "p.hi"))]
    )
    chosen = choose(
        reg, TrainingBackendSpec, explicit=None, enabled={"lo": True, "hi": True}, selector_key="policy.backend"
    )
    assert chosen.describe() == "training backend: hi (priority 200; also enabled: lo 100)"
    only_lo = choose(
        reg, TrainingBackendSpec, explicit=None, enabled={"lo": True, "hi": False}, selector_key="policy.backend"
    )
    assert only_lo.chosen.name == "lo" and not only_lo.runners_up
    named = choose(
        reg, TrainingBackendSpec, explicit="lo", enabled={"lo": True, "hi": True}, selector_key="policy.backend"
    )
    assert named.chosen.name == "lo" and "named by policy.backend" in named.describe()
    with pytest.raises(PluginError, match="no training backend is enabled"):
        choose(
            reg, TrainingBackendSpec, explicit=None, enabled={"lo": False, "hi": False}, selector_key="policy.backend"
        )
    with pytest.raises(PluginError, match="no training backend named 'nope'"):
        choose(reg, TrainingBackendSpec, explicit="nope", enabled={}, selector_key="policy.backend")
    with pytest.raises(PluginError, match=r"named 'hii' is installed \(available: hi, lo\)\. Did you mean 'hi'\?"):
        choose(reg, TrainingBackendSpec, explicit="hii", enabled={}, selector_key="policy.backend")


def test_builtins_register_through_the_same_hooks():
    reg = Registry.discover(entry_points=False)
    assert {"grpo", "reinforce", "sft", "dpo"} <= set(reg.specs("algorithm"))
    assert {"exact_match", "number_match", "regex"} <= set(reg.specs("reward_source"))
    assert reg.owner("algorithm", "grpo").name == "core"


def test_disabled_plugins_are_named_in_errors(monkeypatch):
    monkeypatch.setenv("RL_CORE_DISABLE_PLUGINS", "megatron,dtensor")
    reg = Registry.discover()
    assert reg.plugins["megatron"].status == "disabled"
    with pytest.raises(PluginError, match="disabled by RL_CORE_DISABLE_PLUGINS"):
        reg.get("training_backend", "megatron")


def test_the_automatic_weight_route_follows_device_and_placement_unless_named(rl_registry, make_config):
    from rl_core.plugins.selection import route_description

    describe = lambda device, *o: route_description(make_config(*o), device)  # noqa: E731
    assert describe("cpu").startswith("host_shm when the engine shares the trainer's host")
    assert describe("cuda").startswith("cuda_ipc")
    assert describe("cuda", "policy.generation.colocated=false").startswith("broadcast")
    assert describe("cuda", "policy.generation.weight_transport=object_store").startswith("object_store (named")
    with pytest.raises(ConfigError, match="weight_transport"):
        make_config("policy.generation.weight_transport=nccl")


def test_asynchronous_grpo_with_a_colocated_engine_on_gpus_is_refused_before_anything_starts(rl_registry, make_config):
    """Overlapping generation and training needs the engine on GPUs of its own; on CPU there is nothing to share."""
    from rl_core.plugins.selection import select

    one_step = make_config("grpo.async_mode=one_step")
    with pytest.raises(ConfigError, match=r"grpo.async_mode=one_step .* set policy.generation.colocated=false"):
        select(one_step, rl_registry, "cuda")
    select(one_step, rl_registry, "cpu")
    select(make_config("grpo.async_mode=one_step", "policy.generation.colocated=false"), rl_registry, "cuda")
    select(make_config(), rl_registry, "cuda")


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce"])
def test_rollouts_that_do_not_make_whole_optimizer_steps_are_refused_before_anything_starts(
    rl_registry, make_config, algorithm
):
    from rl_core.plugins.selection import select

    config = make_config(
        f"algorithm={algorithm}",
        f"{algorithm}.num_prompts_per_step=3",
        f"{algorithm}.num_generations_per_prompt=5",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=1",
    )
    with pytest.raises(
        ConfigError,
        match=rf"{algorithm}.num_prompts_per_step x {algorithm}.num_generations_per_prompt \(3 x 5 = 15 rollouts a "
        r"step\) is not a multiple of policy.train_global_batch_size \(8\); change one of them, e.g. "
        r"policy.train_global_batch_size=5",
    ):
        select(config, rl_registry, "cpu")


@pytest.mark.parametrize(
    ("error", "module", "advice"),
    [
        (
            ModuleNotFoundError("No module named 'fancy_kernels'", name="fancy_kernels"),
            "rl_backend_x.plugin",
            "It needs 'fancy_kernels', which is not installed: install the package that provides it",
        ),
        (
            ModuleNotFoundError("No module named 'rl_backend_x'", name="rl_backend_x"),
            "rl_backend_x.plugin",
            "Its own module is missing: reinstall it: pip install --force-reinstall rl-backend-x",
        ),
        (
            ModuleNotFoundError("No module named 'rl_backend_x.plugin'", name="rl_backend_x.plugin"),
            "rl_backend_x.plugin",
            "Its own module is missing: reinstall it",
        ),
        (RuntimeError("bad code"), "rl_backend_x.plugin", "Its code failed while importing: update rl-backend-x"),
    ],
)
def test_a_plugin_that_fails_to_import_gets_advice_that_fits_the_failure(error, module, advice):
    """Reinstalling is advice only when the plugin's own module is missing; a missing dependency is named."""
    from rl_core.plugins.registry import import_advice

    assert import_advice(error, module, "rl-backend-x").startswith(advice)


def test_two_distributions_with_one_plugin_name_are_told_how_to_keep_one():
    reg = Registry.discover(entry_points=False, extra=[("twin", backend_plugin("a", 1, "p.a"))])
    with pytest.raises(PluginError, match=r"two plugins are named 'twin'.* Keep one: pip uninstall twin"):
        reg._add("twin", backend_plugin("b", 1, "p.b"), "twin", "1")


def test_what_a_component_declares_it_does_not_support_is_refused_before_anything_starts(make_config):
    """A backend's ``max_ranks`` and an engine's ``refit_routes`` bound the configs it is selected for."""
    import attrs

    from rl_core.plugins.selection import check_declared
    from rl_core.plugins.specs import RolloutEngineSpec

    one_rank = TrainingBackendSpec(name="solo", factory=object, max_ranks=1)
    shm_only = RolloutEngineSpec(name="shm", factory=object, refit_routes=("host_shm",))
    check_declared(make_config("policy.num_workers=1"), one_rank, shm_only)
    with pytest.raises(ConfigError, match=r"policy.num_workers=2, but training backend 'solo' runs on at most 1 rank"):
        check_declared(make_config("policy.num_workers=2"), one_rank, None)
    broadcast = make_config("policy.generation.weight_transport=broadcast")
    with pytest.raises(ConfigError, match=r"engine 'shm' receives weights only over host_shm"):
        check_declared(broadcast, None, shm_only)
    check_declared(broadcast, None, attrs.evolve(shm_only, refit_routes=("host_shm", "broadcast")))


def test_a_reference_model_is_refused_for_a_backend_that_loads_none(make_config, tiny_model_path):
    """``policy.reference_model_name`` (distillation's teacher) only for a backend declaring ``reference_model``;
    and the distillation loop refuses to start without one, naming the key."""
    import attrs

    from rl_core.algorithms import distill
    from rl_core.plugins.selection import check_declared

    plain = TrainingBackendSpec(name="plain", factory=object)
    teacher = make_config(f"policy.reference_model_name={tiny_model_path}")
    with pytest.raises(ConfigError, match=r"policy.reference_model_name is set, but training backend 'plain' loads"):
        check_declared(teacher, plain, None)
    check_declared(teacher, attrs.evolve(plain, reference_model=True), None)
    with pytest.raises(ConfigError, match=r"algorithm distill needs a teacher: set policy.reference_model_name"):
        distill.check(make_config("algorithm=distill"), "cpu")
    distill.check(make_config("algorithm=distill", f"policy.reference_model_name={tiny_model_path}"), "cpu")


def test_a_score_head_is_refused_where_nothing_trains_or_uses_one(rl_registry, make_config):
    """``policy.head`` must be the head the algorithm trains (``reward_model``: score; the others: lm), LoRA is
    refused with a score head, and a backend must declare ``score_head`` (Megatron does not)."""
    from rl_core.plugins.selection import check_declared, select

    with pytest.raises(ConfigError, match=r"algorithm 'grpo' trains a model with the 'lm' head, but policy.head=score"):
        select(make_config("policy.head=score"), rl_registry, "cpu")
    with pytest.raises(ConfigError, match=r"set policy.head=score"):
        select(make_config("algorithm=reward_model"), rl_registry, "cpu")
    with pytest.raises(ConfigError, match=r"policy.lora is not supported with policy.head=score"):
        select(
            make_config("algorithm=reward_model", "policy.head=score", "policy.lora.enabled=true"), rl_registry, "cpu"
        )
    scored = make_config("algorithm=reward_model", "policy.head=score")
    assert select(scored, rl_registry, "cpu").backend.chosen.name == "dtensor"
    megatron = rl_registry.get(TrainingBackendSpec, "megatron")
    with pytest.raises(ConfigError, match=r"policy.head=score, but training backend 'megatron' trains no score head"):
        check_declared(scored, megatron, None)


def test_ppo_starts_its_critic_only_on_a_backend_that_trains_a_score_head(rl_registry, make_config):
    """PPO's critic is the policy's config with the critic's model, a score head, no LoRA or reference, its own
    optimizer and ranks, on GPUs of its own; Megatron (no score head) is refused before any worker starts."""
    from rl_core.algorithms.ppo import critic_config
    from rl_core.plugins.selection import select

    config = make_config(
        "algorithm=ppo",
        "ppo.num_prompts_per_step=64",
        "policy.lora.enabled=true",
        "ppo.critic.optimizer={lr: 0.5}",
        "ppo.critic.num_workers=2",
    )
    critic = critic_config(config).policy
    assert (critic.head, critic.lora.enabled, critic.reference_model_name) == ("score", False, None)
    assert (critic.optimizer.lr, critic.num_workers, critic.model_name) == (0.5, 2, config.policy.model_name)
    assert select(config, rl_registry, "cpu").algorithm.critic is critic_config
    from rl_core.distributed.placement import policy_layout

    # on GPUs the policy shares its GPUs with the engine; the critic takes GPUs of its own
    assert policy_layout(config, "cuda").shared and policy_layout(config, "cuda").num_gpus == 0.5
    on_gpus = policy_layout(critic_config(config), "cuda")
    assert (on_gpus.shared, on_gpus.num_gpus, on_gpus.size) == ("", 1.0, 2)
    with pytest.raises(ConfigError, match=r"algorithm 'ppo' trains a critic .* training backend 'megatron' trains no"):
        select(
            make_config("algorithm=ppo", "ppo.num_prompts_per_step=64", "policy.backend=megatron"), rl_registry, "cpu"
        )
