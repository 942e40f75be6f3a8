"""Properties every policy-gradient loss variant keeps, over random batches (hypothesis): padding columns and prompt
positions change nothing, reordering the rows reorders nothing, GSPO's ratio is the exponential of the masked mean of
its tokens' log-ratios, and both mismatch masks read the trainer's logprobs over the engine's."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_core.base.schema import LossConfig
from rl_core.training.losses import ClippedPGLoss

VARIANTS = {
    "ppo": {},
    "clip-higher dual-clip": {"ratio_clip_max": 0.28, "ratio_clip_c": 3.0},
    "sequence mean": {"token_level_loss": False},
    "gspo": {"importance_ratio": "sequence", "token_level_loss": False},
    "gspo-token": {"importance_ratio": "sequence_token", "token_level_loss": False},
    "cispo": {"policy_objective": "cispo"},
    "dr-grpo": {"constant_normalizer": 8.0},
    "reinforce": {"disable_ppo_ratio": True},
    "kl k3 on-policy": {"reference_policy_kl_penalty": 0.1, "use_on_policy_kl_approximation": True},
    "tis": {"use_importance_sampling_correction": True, "truncated_importance_sampling_ratio": 1.5},
    "token mask": {"mismatch_mask": "token", "mismatch_mask_low": 0.8, "mismatch_mask_high": 1.25},
    "sequence mask": {"mismatch_mask": "sequence", "mismatch_mask_low": 0.8, "mismatch_mask_high": 1.25},
}
FIELDS = ("advantages", "prev_logprobs", "generation_logprobs", "reference_logprobs")


@st.composite
def batches(draw):
    """Rows of 1-5 loss tokens: the policy's logprobs and the batch's per-token fields, as lists."""
    rows = draw(st.integers(1, 4))
    value = st.floats(-0.6, 0.6, allow_nan=False)
    out = []
    for _ in range(rows):
        n = draw(st.integers(1, 5))
        out.append({key: draw(st.lists(value, min_size=n, max_size=n)) for key in ("logprobs", *FIELDS)})
    return out


def tensors(rows, *, prompt: int = 0, pad: int = 0, fill: float = 0.7):
    """The batch of ``rows`` with ``prompt`` positions before each row's tokens and ``pad`` columns after the
    widest (both outside the loss, holding ``fill`` where a value is stored), and the policy's logprobs."""
    width = prompt + max(len(r["logprobs"]) for r in rows) + pad
    batch = {key: torch.full((len(rows), width), fill, dtype=torch.float64) for key in FIELDS}
    logprobs = torch.full((len(rows), width), fill, dtype=torch.float64)
    mask = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        span = slice(prompt, prompt + len(row["logprobs"]))
        mask[i, span] = 1.0
        logprobs[i, span] = torch.tensor(row["logprobs"], dtype=torch.float64) - 1.0
        for key in FIELDS:
            batch[key][i, span] = torch.tensor(row[key], dtype=torch.float64) - float(key != "advantages")
    batch["loss_mask"] = mask
    batch["attention_mask"] = (mask > 0).long()
    batch["attention_mask"][:, :prompt] = 1
    batch["input_ids"] = torch.zeros(len(rows), width, dtype=torch.long)
    return batch, logprobs.requires_grad_(True), mask


def run(cfg: dict, batch, logprobs):
    loss_fn = ClippedPGLoss(cfg=LossConfig(**cfg))
    loss, metrics = loss_fn(batch, logprobs, loss_fn.count(batch))
    loss.backward()
    return float(loss.detach()), metrics, logprobs.grad


def loss_tokens(grad: torch.Tensor, mask: torch.Tensor) -> list[float]:
    return grad[mask > 0].tolist()


@pytest.mark.parametrize("variant", VARIANTS)
@settings(max_examples=10, deadline=None)
@given(rows=batches(), prompt=st.integers(0, 3), pad=st.integers(1, 3))
def test_padding_columns_and_prompt_positions_change_nothing(variant, rows, prompt, pad):
    cfg = VARIANTS[variant]
    plain_loss, plain_metrics, plain_grad = run(cfg, *tensors(rows)[:2])
    batch, logprobs, mask = tensors(rows, prompt=prompt, pad=pad)
    loss, metrics, grad = run(cfg, batch, logprobs)
    assert loss == pytest.approx(plain_loss, abs=1e-12)
    assert loss_tokens(grad, mask) == pytest.approx(loss_tokens(plain_grad, tensors(rows)[2]), abs=1e-12)
    assert grad[mask == 0].abs().max() == 0.0
    for key in ("ratio", "clip_fraction", "kl", "mismatch_masked_fraction"):
        if key in metrics:
            assert float(metrics[key]) == pytest.approx(float(plain_metrics[key]), abs=1e-12), key


@pytest.mark.parametrize("variant", VARIANTS)
@settings(max_examples=5, deadline=None)
@given(rows=batches(), seed=st.integers(0, 1000))
def test_reordering_the_rows_reorders_the_gradients_and_keeps_the_loss(variant, rows, seed):
    cfg = VARIANTS[variant]
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    loss, _, grad = run(cfg, *tensors(rows)[:2])
    moved_loss, _, moved_grad = run(cfg, *tensors([rows[i] for i in order])[:2])
    assert moved_loss == pytest.approx(loss, abs=1e-12)
    assert moved_grad.flatten().tolist() == pytest.approx(grad[order].flatten().tolist(), abs=1e-12)


@settings(max_examples=20, deadline=None)
@given(rows=batches(), prompt=st.integers(0, 2), pad=st.integers(0, 2))
def test_gspos_ratio_is_the_exponential_of_the_masked_mean_log_ratio(rows, prompt, pad):
    batch, logprobs, _ = tensors(rows, prompt=prompt, pad=pad)
    _, metrics, _ = run(VARIANTS["gspo"], batch, logprobs)
    expected = [
        math.exp(
            sum(lp - prev for lp, prev in zip(r["logprobs"], r["prev_logprobs"], strict=True)) / len(r["logprobs"])
        )
        for r in rows
    ]
    assert float(metrics["ratio"]) == pytest.approx(sum(expected) / len(expected), rel=1e-9)


@pytest.mark.parametrize("level", ["token", "sequence"])
@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 40), log_q=st.floats(0.05, 0.5))
def test_the_mismatch_masks_read_the_trainer_over_the_engine_and_a_sequence_its_geometric_mean(level, n, log_q):
    """Every token with the trainer's logprob ``log_q`` above the engine's: q = exp(log_q) on each token and, for a
    sequence, the geometric mean of its tokens' q (the same q at any length; their product would grow with it).
    Above the high bound the row is masked; the engine above the trainer by as much, it is kept (no low bound)."""
    high = math.exp(log_q) * 0.99  # just under each token's q
    row = {"logprobs": [0.0] * n, "advantages": [1.0] * n, "reference_logprobs": [0.0] * n}
    cfg = {"mismatch_mask": level, "mismatch_mask_high": high}
    trainer_above = tensors([{**row, "prev_logprobs": [log_q] * n, "generation_logprobs": [0.0] * n}])[:2]
    engine_above = tensors([{**row, "prev_logprobs": [0.0] * n, "generation_logprobs": [log_q] * n}])[:2]
    assert float(run(cfg, *trainer_above)[1]["mismatch_masked_fraction"]) == 1.0
    assert float(run(cfg, *engine_above)[1]["mismatch_masked_fraction"]) == 0.0
    kept = {**cfg, "mismatch_mask_high": math.exp(log_q) * 1.01}  # just over: the whole row is kept, at any length
    assert float(run(kept, *trainer_above)[1]["mismatch_masked_fraction"]) == 0.0
