"""The megatron-core backend for real on CPU (gloo): conversion, logits parity, training, resharding, at tensor
and pipeline parallel layouts."""

from pathlib import Path

import backend_mutants
import pytest
import torch
from backend_mutants import MUTANTS, PerMicroBatchMean, StaleRefit

from rl_core.base.schema import LossConfig
from rl_core.certify.backend import certify_backend
from rl_core.certify.conformance import hf_logprobs, sample_batch
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


def make(rl_registry, model: Path, tmp_path: Path, *overrides: str, backend: str = "megatron"):
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
            f"policy.backend={backend}",
            *overrides,
        ],
        rl_registry,
    )
    if backend == "megatron":
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


#: the architectures and the layouts their logits are checked at: every layout for the two that between them hold
#: every mapping case (qkv biases, tied embeddings split over pipeline stages, per-head q/k norms, head_dim apart
#: from hidden/heads); Llama, whose layers are Mistral's and Qwen2's without biases, at one rank
PARITY = {"qwen2-tiny-tied": tuple(LAYOUTS), "qwen3-tiny": tuple(LAYOUTS), "llama-tiny": ("tp1",)}


@pytest.mark.parametrize("name", PARITY)
def test_logits_match_hugging_face_at_every_layout(ray_session, rl_registry, tmp_path, name):
    from rl_core.data.tiny_models import ensure_tiny_model

    path = ensure_tiny_model(name)
    batch = pg_batch(tokenizer_of(path))
    expected = hf_logprobs(path, batch)
    for layout in PARITY[name]:
        backend = make(rl_registry, path, tmp_path / layout, *LAYOUTS[layout])
        try:
            ours = backend.logprobs(batch)
        finally:
            backend.shutdown()
        assert float((ours - expected).abs().max()) < 1e-5, layout


def losses(backend, batch, steps=3):
    loss_fn = ClippedPGLoss(cfg=LossConfig(disable_ppo_ratio=True))
    return [backend.train(batch, loss_fn)["loss"] for _ in range(steps)]


def test_training_matches_dtensor_and_every_layout_matches_tp1(ray_session, rl_registry, tiny_model_path, tmp_path):
    batch = pg_batch(tokenizer_of(tiny_model_path))
    runs = {}
    for name, extra, backend in (("dtensor", [], "dtensor"), *((k, v, "megatron") for k, v in LAYOUTS.items())):
        be = make(rl_registry, tiny_model_path, tmp_path / name, *extra, backend=backend)
        try:
            runs[name] = losses(be, batch)
        finally:
            be.shutdown()
    print(runs)
    assert runs["tp2"] == pytest.approx(runs["tp1"], abs=1e-5)
    assert runs["pp2"] == pytest.approx(runs["tp1"], abs=1e-5)
    # same loss, same AdamW (Megatron's Adam with decoupled weight decay 0), same clipping: within 1e-4
    assert runs["tp1"] == pytest.approx(runs["dtensor"], abs=1e-4)


def test_two_data_parallel_ranks_take_the_one_rank_sgd_step(ray_session, rl_registry, tiny_model_path, tmp_path):
    """Under plain SGD an update is proportional to the loss's scale (Adam's is not): Megatron's DDP averages
    gradients over data-parallel ranks, so each rank's share of the globally normalised loss is scaled back up by
    DP; scaled twice, or not at all, the second and third losses part from one rank's."""
    batch = pg_batch(tokenizer_of(tiny_model_path))
    sgd = ["policy.optimizer.name=sgd", "policy.optimizer.lr=0.5", "policy.max_grad_norm=null"]
    runs = {}
    for name, extra in (("dp1", []), ("dp2", ["policy.num_workers=2"])):
        be = make(rl_registry, tiny_model_path, tmp_path / name, *sgd, *extra)
        try:
            runs[name] = losses(be, batch)
        finally:
            be.shutdown()
    assert abs(runs["dp1"][2] - runs["dp1"][0]) > 1e-2, "the SGD steps moved the loss"
    assert runs["dp2"] == pytest.approx(runs["dp1"], abs=1e-5)


def test_tied_embeddings_train_alike_split_over_pipeline_stages(ray_session, rl_registry, tmp_path):
    """The embedding's two copies (first and last stage) get the sum of both gradients and stay equal."""
    from rl_core.data.tiny_models import ensure_tiny_model

    path = ensure_tiny_model("qwen2-tiny-tied")
    batch = pg_batch(tokenizer_of(path))
    runs, weights = {}, {}
    for layout in ("tp1", "pp2"):
        be = make(rl_registry, path, tmp_path / layout, *LAYOUTS[layout])
        try:
            runs[layout] = losses(be, batch)
            weights[layout] = dict(receive_weights(be.weights_for_refit(RefitRoute(kind="object_store"))))
        finally:
            be.shutdown()
    assert runs["pp2"] == pytest.approx(runs["tp1"], abs=1e-5)
    assert "lm_head.weight" not in weights["pp2"]
    for name, w in weights["tp1"].items():
        assert torch.allclose(weights["pp2"][name], w, atol=1e-5), name


@pytest.mark.parametrize(("save", "load"), [("tp2", "tp1"), ("tp1", "tp2"), ("pp2", "tp2")])
def test_save_at_one_layout_load_at_another(ray_session, rl_registry, tiny_model_path, tmp_path, save, load):
    batch = pg_batch(tokenizer_of(tiny_model_path))
    first = make(rl_registry, tiny_model_path, tmp_path / "a", *LAYOUTS[save])
    try:
        losses(first, batch, steps=2)
        first.save_checkpoint(tmp_path / "ckpt")
        expected = losses(first, batch, steps=1)
    finally:
        first.shutdown()
    second = make(rl_registry, tiny_model_path, tmp_path / "b", *LAYOUTS[load])
    try:
        second.load_checkpoint(tmp_path / "ckpt")
        assert losses(second, batch, steps=1) == pytest.approx(expected, abs=1e-6)
    finally:
        second.shutdown()


def test_certify_passes_the_megatron_backend(ray_session, rl_registry, tiny_model_path, tmp_path):
    """The certify checks at TP=2, against one row per micro-batch and against one tensor-parallel rank."""
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
            "one tensor-parallel rank": ["policy.num_workers=1", "policy.megatron_cfg.tensor_model_parallel_size=1"],
        },
        sgd=rl_registry.get("training_backend", "megatron").sgd_overrides,
    )
    assert card.passed, [r for r in card.results if not r.passed]


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
        build, tiny_model_path, tokenizer_of(tiny_model_path), work, quick=True, only=[MUTANTS[mutant]]
    )
    assert not card.passed and MUTANTS[mutant] in card.failed(), card.failed()


def test_refit_weights_carry_hugging_face_names(ray_session, rl_registry, tiny_model_path, tmp_path):
    backend = make(rl_registry, tiny_model_path, tmp_path / "run", *LAYOUTS["tp2"])
    try:
        names = {k for k, _ in receive_weights(backend.weights_for_refit(RefitRoute(kind="object_store")))}
        assert "model.layers.0.self_attn.q_proj.weight" in names and "lm_head.weight" in names
    finally:
        backend.shutdown()
