"""reasoning-gym's datasets as rl-core data and its scorers as a reward source, with the real library: rows seeded,
sized and held out, each dataset's own ``score_answer``, and every mistake named before a worker starts."""

import pytest
from rl_env_reasoning_gym.config import ScoreConfig
from rl_env_reasoning_gym.score import ReasoningGymScore

from rl_core.api import ConfigError, InputError, PluginError
from rl_core.base.schema import DataConfig
from rl_core.certify import certify
from rl_core.certify.card import Card
from rl_core.certify.task import certify_task
from rl_core.data.prompts import load_split
from rl_core.plugins.registry import Registry

SUMS = {"config": {"min_terms": 2, "max_terms": 2, "max_digits": 1, "allow_negation": False, "operators": ["+"]}}


def rows(rl_registry, split="train", **data):
    return load_split(DataConfig(**{"task": "reasoning_gym:basic_arithmetic", **data}), split, rl_registry.task)


def test_rows_are_seeded_sized_and_the_held_out_ones_never_trained_on(rl_registry):
    train = rows(rl_registry, num_train=64, task_options=SUMS)
    assert len(train) == 64 and train == rows(rl_registry, num_train=64, task_options=SUMS)
    assert [r["prompt"] for r in train] != [
        r["prompt"] for r in rows(rl_registry, num_train=64, seed=1, task_options=SUMS)
    ]
    val = rows(rl_registry, "val", num_train=64, num_val=64, task_options=SUMS)
    assert val and not {r["prompt"] for r in val} & {r["prompt"] for r in train}
    first = train[0]
    a, b = (int(x) for x in first["reasoning_gym"]["metadata"]["expression"].split(" + "))
    assert first["answer"] == str(a + b) and first["prompt"] == first["reasoning_gym"]["question"]
    assert first["response"] == f"<answer>{a + b}</answer>"


def test_a_format_warm_up_shuffles_the_answers_among_the_rows(rl_registry):
    options = {**SUMS, "prompt": "{question} Answer:", "response": " {answer}", "shuffled_answers": True}
    warm = rows(rl_registry, num_train=200, task_options=options)
    given = [r["response"].strip() for r in warm]
    assert sorted(given) == sorted(r["answer"] for r in warm)  # the same answers, in another order
    assert sum(g != r["answer"] for g, r in zip(given, warm)) > 150
    assert warm[0]["prompt"].endswith(". Answer:")


def test_the_scorer_is_the_datasets_own_on_the_answer_it_reads(rl_registry):
    train = rows(rl_registry, num_train=8, task_options=SUMS) + load_split(
        DataConfig(task="reasoning_gym:count_bits", num_train=8), "train", rl_registry.task
    )
    prompts = [r["prompt"] for r in train]
    tagged = ReasoningGymScore()
    assert tagged.score(prompts, [r["response"] for r in train], train) == [1.0] * 16
    assert tagged.score(prompts, [f"<answer>{int(r['answer']) + 1}</answer>" for r in train], train) == [0.0] * 16
    assert tagged.score(prompts, [r["answer"] for r in train], train) == [0.0] * 16  # no tag: no answer
    bare = ReasoningGymScore(cfg=ScoreConfig(answer_tag=None))
    assert bare.score(prompts, [f" {r['answer']}\n" for r in train], train) == [1.0] * 16
    with pytest.raises(InputError, match="rows of data.task: reasoning_gym:NAME"):
        tagged.score(["q"], ["1"], [{"answer": "1"}])


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"task": "reasoning_gym:basic_arithmetc"}, "did you mean basic_arithmetic"),
        ({"task": "reasoning_gym"}, "'reasoning_gym:VARIANT'"),
        ({"task_options": {"config": {"min_term": 2}}}, "min_term is not a setting .* its settings: min_terms"),
        (
            {"task_options": {"config": {"min_terms": 0}}},
            "refuses it for 'basic_arithmetic': min_terms must be positive",
        ),
        ({"task_options": {"promt": "{question}"}}, "did you mean 'data.task_options.prompt'"),
    ],
)
def test_a_wrong_name_or_setting_is_refused_naming_the_key(rl_registry, data, says):
    with pytest.raises(ConfigError, match=says):
        rows(rl_registry, num_train=4, **data)


def test_without_the_plugin_the_task_and_the_scorer_name_the_package_to_install():
    bare = Registry.discover(disabled=["reasoning_gym"])
    with pytest.raises(ConfigError, match="rl-env-reasoning-gym"):
        load_split(DataConfig(task="reasoning_gym:basic_arithmetic"), "train", bare.task)
    assert "rl-env-reasoning-gym" in bare.why_missing("reward_source", "reasoning_gym")


def test_certify_passes_the_adapter_on_its_rows_and_fails_a_scorer_that_misreads_them(rl_registry, tmp_path):
    card = certify(
        "reasoning_gym:chain_sum", rl_registry, options=["config={min_terms: 2, max_terms: 2}"], work=tmp_path
    )
    assert card.passed, card.as_dict()
    assert "'reasoning_gym': each row's own response scores above another row's" in [r.check for r in card.results]
    misreads = {"reasoning_gym": ReasoningGymScore(cfg=ScoreConfig(answer_tag="final"))}
    task = rl_registry.task("reasoning_gym")
    card = certify_task(task, "reasoning_gym:chain_sum", {}, misreads, card=Card("task", "planted"))
    assert card.failed() == ["'reasoning_gym': each row's own response scores above another row's"]
    with pytest.raises(PluginError, match="say which with --kind"):
        certify("reasoning_gym", rl_registry, work=tmp_path)
