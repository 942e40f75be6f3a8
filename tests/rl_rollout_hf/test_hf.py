"""The Hugging Face generate engine for real, against the real DTensor training backend: conformance, logprobs
against the trainer's, stop strings and finish reasons, refit over every route the CPU offers."""

import asyncio
import time

import pytest
from engine_mutants import MUTANTS, BroadcastNoop, NoopRefit, ScaledLogprobs

from rl_core.certify.conformance import check_rollout_engine
from rl_core.certify.engine import certify_engine
from rl_core.contracts.protocols import SamplingParams
from rl_core.contracts.refit import RefitRoute
from rl_core.plugins.hookspecs import hookimpl
from rl_core.plugins.specs import RolloutEngineSpec
from rl_core.training.losses import NLLLoss
from rl_core.training.rollouts import rollout_batch

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROMPTS = ["Q: 3 + 4 = ? A:", "Sort the digits 9 1 4. Answer:", "Even or odd? 4 8 1 7", "the answer is"]


@pytest.fixture(scope="module")
def config(engine_test_config):
    return engine_test_config("policy.generation.hf_cfg.max_batch_size=6")


@pytest.fixture(scope="module")
def backend(ray_session, config, engine):
    """Started when a test first needs it: alive beside the engine-only tests before, it made each of them slower
    (~0.3 s a certify card, more than its start costs)."""
    from rl_backend_dtensor.backend import make_backend

    be = make_backend(config, config.section("policy.dtensor_cfg"))
    yield be
    be.shutdown()


def encode(tokenizer):
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def max_gap(batch, trainer_logprobs) -> float:
    mask = batch["loss_mask"].bool()
    return float((batch["generation_logprobs"][mask] - trainer_logprobs[mask]).abs().max())


def test_conformance(engine, tokenizer):
    check_rollout_engine(engine, tokenizer)


def test_certify_passes_the_hf_engine(engine, tiny_model_path, tokenizer):
    routes = ("host_shm", "object_store", "broadcast", "cuda_ipc")
    card = certify_engine(engine, tiny_model_path, tokenizer, routes=routes, declared=routes[:3])
    assert card.passed, [r for r in card.results if not r.passed]
    refits = {r.check: r for r in card.results if r.check.startswith("refit over")}
    assert [c for c, r in refits.items() if not r.skipped] == [
        f"refit over {r} loads the new weights" for r in routes[:3]
    ]
    assert refits["refit over cuda_ipc loads the new weights"].skipped, "an undeclared route is skipped, not tried"


@pytest.mark.parametrize("mutant", list(MUTANTS), ids=lambda m: m.__name__)
def test_certify_fails_every_planted_bug(engine, tiny_model_path, tokenizer, mutant, restore_engine):
    card = certify_engine(mutant(restore_engine(engine), tokenizer), tiny_model_path, tokenizer, quick=True)
    assert not card.passed and MUTANTS[mutant] in card.failed(), card.failed()


def test_certify_fails_an_ignored_broadcast_within_its_bound_naming_the_route(
    engine, tiny_model_path, tokenizer, restore_engine
):
    """An engine that answers a broadcast refit without joining the group leaves the sender waiting: the check fails
    after the refit bound (here 4 s), naming the route, and the checks after it still run."""
    start = time.monotonic()
    mutant = BroadcastNoop(restore_engine(engine), tokenizer)
    card = certify_engine(mutant, tiny_model_path, tokenizer, routes=("host_shm", "broadcast"), refit_timeout_s=4)
    failed = {r.check: r.detail for r in card.results if not r.passed}
    assert list(failed) == ["refit over broadcast loads the new weights"], failed
    assert "did not finish within 4 s" in failed["refit over broadcast loads the new weights"]
    assert time.monotonic() - start < 100


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0], ids=["t1", "t0.7", "greedy"])
def test_logprobs_agree_with_the_trainer_at_any_temperature(engine, backend, tokenizer, temperature):
    """The engine returns the policy's logprobs (raw logits) whatever the sampling temperature."""
    rollouts = engine.generate(
        encode(tokenizer), SamplingParams(n=3, max_new_tokens=12, temperature=temperature, seed=1)
    )
    batch = rollout_batch(rollouts, tokenizer.pad_token_id, 64)
    assert batch["loss_mask"].sum() > 20
    # the reference policy is the model's own weights whatever training earlier tests did; restore_engine gives the
    # engine those back after every test that changes them
    assert max_gap(batch, backend.reference_logprobs(batch)) < 1e-5


def test_stop_strings_and_finish_reasons(engine, tokenizer):
    prompts = encode(tokenizer)
    free = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=10, seed=3))
    assert all((r.finish_reason == "length") == (len(r.token_ids) == 10) for r in free)
    # a stop string made of text the free run produced: every such rollout stops there, the string cut from its text
    text = next(r.text for r in free if len(r.text.strip()) >= 2).strip()[:2]
    stopped = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=10, seed=3, stop_strings=(text,)))
    for before, after in zip(free, stopped, strict=True):
        if text in before.text:
            assert after.finish_reason == "stop" and text not in after.text and before.text.startswith(after.text)
            assert len(after.token_ids) <= len(before.token_ids) and len(after.logprobs) == len(after.token_ids)


def test_stream_yields_what_generate_returns(engine, tokenizer):
    params = SamplingParams(n=3, max_new_tokens=8, seed=7)

    async def collect():
        return [r async for r in engine.stream(encode(tokenizer), params)]

    key = lambda r: (r.prompt_index, r.sample_index)  # noqa: E731
    assert sorted(asyncio.run(collect()), key=key) == engine.generate(encode(tokenizer), params)


@pytest.mark.parametrize("route", [None, "object_store", "broadcast"], ids=["auto", "object_store", "broadcast"])
def test_refit_updates_the_engine_in_place(engine, backend, tokenizer, route, restore_engine):
    restore_engine(engine)
    rollouts = engine.generate(encode(tokenizer), SamplingParams(n=4, max_new_tokens=12, seed=2))
    backend.train(rollout_batch(rollouts, tokenizer.pad_token_id, 64), NLLLoss())
    payload = backend.weights_for_refit(RefitRoute(kind=route, receivers=tuple(engine.weight_receivers()), verify=True))
    assert payload.kind == {None: "host_shm", "object_store": "object_store", "broadcast": "broadcast"}[route]
    stats = engine.update_weights(payload)
    assert stats.route == payload.kind and stats.checksums == pytest.approx(payload.checksums, rel=1e-9)
    after = rollout_batch(
        engine.generate(encode(tokenizer), SamplingParams(n=4, max_new_tokens=12, seed=3)), tokenizer.pad_token_id, 64
    )
    assert max_gap(after, backend.logprobs(after)) < 1e-5  # agrees with the updated weights
    assert max_gap(after, backend.reference_logprobs(after)) > 1e-2  # and visibly not with the old ones


class WrongEngines:
    """Engine plugins with planted bugs, for the health checks of a real run."""

    @hookimpl
    def rl_rollout_engines(self):
        def wrapped(mutant):
            def factory(config, section):
                from transformers import AutoTokenizer

                from rl_rollout_hf.engine import make_engine

                inner = make_engine(config, config.section("policy.generation.hf_cfg"))
                return mutant(inner, AutoTokenizer.from_pretrained(config.policy.model_name))

            return factory

        return [
            RolloutEngineSpec(name="scaled-logprobs", factory=wrapped(ScaledLogprobs), package="planted-bug"),
            RolloutEngineSpec(name="noop-refit", factory=wrapped(NoopRefit), package="planted-bug"),
        ]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("scaled-logprobs", r"rollout engine 'scaled-logprobs' \(planted-bug\) returns logprobs that differ"),
        ("noop-refit", r"weight sync failed: .* rollout engine 'noop-refit' \(planted-bug\) reported no checksums"),
    ],
)
def test_a_run_with_a_wrong_engine_stops_naming_it(ray_session, make_config, tiny_model_path, name, message):
    from rl_core.launch.run import run_config
    from rl_core.outputs.console import RunConsole
    from rl_core.plugins.registry import Registry
    from rl_core.training.health import HealthCheckError

    config = make_config(
        "warmup_recipe=null",
        f"policy.model_name={tiny_model_path}",
        "cluster.device=cpu",
        f"policy.generation.backend={name}",
    )
    with pytest.raises(HealthCheckError, match=message):
        run_config(config, Registry.discover(extra=[("wrong", WrongEngines())]), RunConsole(progress=False))
