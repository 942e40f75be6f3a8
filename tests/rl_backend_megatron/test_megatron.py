"""The megatron-core backend for real on CPU (gloo): conversion, logits parity, training, resharding, at tensor
and pipeline parallel layouts."""

import contextlib
from pathlib import Path

import backend_mutants
import pytest
import torch
from backend_mutants import MUTANTS, PerMicroBatchMean, StaleRefit

from rl_core.base.schema import LossConfig
from rl_core.certify.backend import certify_backend
from rl_core.certify.conformance import hf_logprobs, sample_batch
from rl_core.certify.starts import AheadStarts
from rl_core.config.loader import load_config
from rl_core.contracts import batch as B
from rl_core.contracts.refit import RefitRoute, receive_weights
from rl_core.training.losses import ClippedPGLoss

pytestmark = [pytest.mark.ray, pytest.mark.megatron, pytest.mark.slow]


@pytest.fixture(autouse=True)
def conversion_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RL_MEGATRON_CHECKPOINT_DIR", str(tmp_path_factory.getbasetemp() / "megatron"))


def tokenizer_of(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def make(rl_registry, model: Path, tmp_path: Path, *overrides: str):
    """A Megatron backend, or a DTensor one where the overrides say ``policy.backend=dtensor``."""
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path}",
            "cluster.device=cpu",
            f"policy.model_name={model}",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=4",
            "policy.logprob_batch_size=4",
            "policy.max_total_sequence_length=64",
            "policy.optimizer.lr=1e-4",
            "policy.max_grad_norm=1.0",
            "policy.backend=megatron",
            *overrides,
        ],
        rl_registry,
    )
    if cfg.policy.backend == "megatron":
        from rl_backend_megatron.backend import make_backend as make_megatron

        return make_megatron(cfg, cfg.section("policy.megatron_cfg"))
    from rl_backend_dtensor.backend import make_backend as make_dtensor

    return make_dtensor(cfg, cfg.section("policy.dtensor_cfg"))


#: parallel layouts over 2 ranks, as config overrides
LAYOUTS = {
    "tp1": ["policy.megatron_cfg.tensor_model_parallel_size=1"],
    "tp2": ["policy.num_workers=2", "policy.megatron_cfg.tensor_model_parallel_size=2"],
    "pp2": ["policy.num_workers=2", "policy.megatron_cfg.pipeline_model_parallel_size=2"],
}


def pg_batch(tokenizer) -> B.Batch:
    batch = B.concat([sample_batch(tokenizer, response=r) for r in (" 7 and 8", " 12", " nine")])
    batch = B.select(batch, slice(0, 8))
    batch["advantages"] = torch.randn(8, 1, generator=torch.Generator().manual_seed(0)) * batch["loss_mask"]
    return batch


#: the architectures and the layouts their logits are checked at. The weights are mapped once, at conversion, for
#: every layout; a layout splits them inside megatron-core. So: every layout for the tied Qwen2 (qkv biases, and
#: tied embeddings split over pipeline stages); Qwen3 (per-head q/k norms, head_dim apart from hidden/heads) with
#: its heads split over two tensor-parallel ranks; Llama, whose layers are Mistral's and Qwen2's without biases, at
#: one rank
PARITY = {"qwen2-tiny-tied": tuple(LAYOUTS), "qwen3-tiny": ("tp2",), "llama-tiny": ("tp1",)}


@pytest.mark.parametrize("name", PARITY)
def test_logits_match_hugging_face_at_the_layouts_that_split_each_architecture(
    ray_session, rl_registry, tmp_path, name
):
    """Each layout's logprobs are Hugging Face's. On the tied model, the backends at one stage and split over two
    pipeline stages then train alike: the embedding's two copies (first and last stage) get the sum of both
    gradients and stay equal, and the refit sends it once (no ``lm_head.weight``)."""
    from rl_core.data.tiny_models import ensure_tiny_model

    path = ensure_tiny_model(name)
    batch = pg_batch(tokenizer_of(path))
    expected = hf_logprobs(path, batch)
    trained, weights = {}, {}
    layouts = {tuple(LAYOUTS[layout]): layout for layout in PARITY[name]}

    def make_at(overrides):
        return make(rl_registry, path, tmp_path / layouts[tuple(overrides)], *overrides)

    with contextlib.closing(AheadStarts(make_at, list(layouts), 2)) as starts:  # a failed check leaves none started
        for layout in PARITY[name]:
            backend = starts(LAYOUTS[layout])
            try:
                ours = backend.logprobs(batch)
                if name == "qwen2-tiny-tied" and layout in ("tp1", "pp2"):
                    trained[layout] = losses(backend, batch)
                    routed = backend.weights_for_refit(RefitRoute(kind="object_store"))
                    weights[layout] = dict(receive_weights(routed))
            finally:
                backend.shutdown()
            assert float((ours - expected).abs().max()) < 1e-5, layout
    if trained:
        assert trained["pp2"] == pytest.approx(trained["tp1"], abs=1e-5)
        assert "lm_head.weight" not in weights["pp2"] and weights["pp2"].keys() == weights["tp1"].keys()
        for key, w in weights["tp1"].items():
            assert torch.allclose(weights["pp2"][key], w, atol=1e-5), key


def losses(backend, batch, steps=3):
    loss_fn = ClippedPGLoss(cfg=LossConfig(disable_ppo_ratio=True))
    return [backend.train(batch, loss_fn)["loss"] for _ in range(steps)]


def test_a_checkpoint_saved_at_one_layout_resumes_at_another(ray_session, rl_registry, tiny_model_path, tmp_path):
    """A chain of backends, each resuming the one before's checkpoint: saved split over two tensor-parallel ranks,
    loaded over two pipeline stages; saved there, loaded on one rank. Each resumed step's loss is the one the saving
    backend took next (weights, Adam's moments and its step count all came back). The first backend's refit weights
    carry Hugging Face names, the tied head included."""
    batch = pg_batch(tokenizer_of(tiny_model_path))
    chain = ["tp2", "pp2", "tp1"]
    # each backend starts while the one before trains (a start is mostly one core importing torch)
    planned = chain_of(chain)

    def make_in(folder_and_overrides):
        return make(rl_registry, tiny_model_path, tmp_path / folder_and_overrides[0], *folder_and_overrides[1:])

    expected = None
    with contextlib.closing(AheadStarts(make_in, planned, 2)) as starts:  # a failed check leaves none started
        for i, layout in enumerate(chain):
            backend = starts(planned[i])
            try:
                if i == 0:
                    routed = receive_weights(backend.weights_for_refit(RefitRoute(kind="object_store")))
                    names = {k for k, _ in routed}
                    assert "model.layers.0.self_attn.q_proj.weight" in names and "lm_head.weight" in names
                    losses(backend, batch, steps=2)
                else:
                    backend.load_checkpoint(tmp_path / f"ckpt{i - 1}")
                    resumed = losses(backend, batch, steps=1)
                    assert resumed == pytest.approx(expected, abs=1e-6), f"saved at {chain[i - 1]}, loaded at {layout}"
                if i < len(chain) - 1:
                    backend.save_checkpoint(tmp_path / f"ckpt{i}")
                    expected = losses(backend, batch, steps=1)
            finally:
                backend.shutdown()


def chain_of(layouts: list[str]) -> list[list[str]]:
    """Each layout's overrides after the name of its backend's run folder."""
    return [[f"b{i}", *LAYOUTS[layout]] for i, layout in enumerate(layouts)]


def test_certify_passes_the_megatron_backend(ray_session, rl_registry, tiny_model_path, tmp_path):
    """The certify checks at TP=2, and its gradient checks (one plain SGD step at learning rate 1, whose update is
    the gradient, where Adam's first is ``lr * sign(g)``) against the other layouts and against DTensor on one rank
    (the reference): one row per micro-batch, two pipeline stages, two data-parallel ranks of one tensor-parallel
    rank each (Megatron's DDP averages gradients over them, so each rank's share of the globally normalised loss is
    scaled back up by DP: a gradient scaled twice, or not at all, or a layout's wrong reduction, fails)."""
    runs = iter(range(100))
    card = certify_backend(
        lambda overrides: make(
            rl_registry, tiny_model_path, tmp_path / f"run{next(runs)}", *LAYOUTS["tp2"], *overrides
        ),
        tiny_model_path,
        tokenizer_of(tiny_model_path),
        tmp_path / "work",
        variants={
            "one row per micro-batch": ["policy.train_micro_batch_size=1"],
            "two pipeline stages": [
                "policy.megatron_cfg.tensor_model_parallel_size=1",
                "policy.megatron_cfg.pipeline_model_parallel_size=2",
            ],
            "two data-parallel ranks": ["policy.megatron_cfg.tensor_model_parallel_size=1"],
            "the DTensor backend": ["policy.backend=dtensor", "policy.num_workers=1"],
        },
        sgd=rl_registry.get("training_backend", "megatron").sgd_overrides,
        starts_at_once=2,
    )
    assert card.passed, [r for r in card.results if not r.passed]
    compared = [r.check for r in card.results if r.check.startswith("loss and gradients are the same")]
    assert len(compared) == 4 and not any(r.skipped for r in card.results), card.results


@pytest.mark.parametrize("mutant", [PerMicroBatchMean, StaleRefit], ids=lambda m: m.__name__)
def test_certify_fails_planted_bugs_around_megatron(ray_session, rl_registry, tiny_model_path, tmp_path, mutant):
    """Planted bugs over Megatron's own loss scaling and weight export: a per-micro-batch mean under its pipeline
    schedule, and refits that keep the first weights. Each fails certify on the check that names it."""
    import ray

    ray.cloudpickle.register_pickle_by_value(backend_mutants)  # its loss wrapper travels to the workers
    runs = iter(range(100))

    def build(overrides):
        return mutant(make(rl_registry, tiny_model_path, tmp_path / f"run{next(runs)}", *overrides), tiny_model_path)

    work = tmp_path / "work"
    # only the check that must fail: its backends alone start (one for a single-backend check, two for a gradient one)
    card = certify_backend(
        build,
        tiny_model_path,
        tokenizer_of(tiny_model_path),
        work,
        quick=True,
        only=[MUTANTS[mutant]],
        starts_at_once=2,
    )
    assert not card.passed and MUTANTS[mutant] in card.failed(), card.failed()
