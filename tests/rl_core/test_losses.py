"""Losses against values worked out by hand (see the comments), never by calling the code under test."""

import math

import pytest
import torch

from rl_core.base.errors import InputError
from rl_core.base.schema import LossConfig
from rl_core.training.losses import BradleyTerryLoss, ClippedPGLoss, DPOLoss, NLLLoss, ValueLoss, kl_estimate


def pg_batch(ratios, advantages, prev=None, **extra):
    ratios = torch.tensor([ratios], dtype=torch.float64)
    prev = torch.zeros_like(ratios) if prev is None else torch.tensor([prev], dtype=torch.float64)
    batch = {
        "input_ids": torch.zeros(ratios.shape, dtype=torch.long),
        "attention_mask": torch.ones(ratios.shape, dtype=torch.long),
        "loss_mask": torch.ones(ratios.shape),
        "advantages": torch.tensor([advantages], dtype=torch.float64),
        "prev_logprobs": prev,
        **extra,
    }
    return batch, prev + torch.log(ratios)


def test_clipping_active_on_both_sides_with_clip_higher():
    # eps_lo = 0.2, eps_hi = 0.28: clip range [0.8, 1.28]
    # t0: r=0.5, A=+1: max(-0.5, -0.8)  = -0.5  (no clip for A>0 below)
    # t1: r=1.5, A=+1: max(-1.5, -1.28) = -1.28 (upper clip active)
    # t2: r=0.5, A=-1: max(0.5, 0.8)    = 0.8   (lower clip active)
    # t3: r=1.5, A=-1: max(1.5, 1.28)   = 1.5   (no clip for A<0 above)
    batch, logprobs = pg_batch([0.5, 1.5, 0.5, 1.5], [1.0, 1.0, -1.0, -1.0])
    loss_fn = ClippedPGLoss(cfg=LossConfig(ratio_clip_min=0.2, ratio_clip_max=0.28))
    loss, metrics = loss_fn(batch, logprobs, loss_fn.count(batch))
    assert float(loss) == pytest.approx((-0.5 - 1.28 + 0.8 + 1.5) / 4)
    assert float(metrics["clip_fraction"]) == pytest.approx(2 / 4)


def test_dual_clip_bounds_negative_advantages():
    # r=5, A=-1: clipped PPO term max(5, 1.2) = 5; dual clip c=3 bounds it at -A*c = 3.
    # r=5, A=+1: min(-5, -1.2) -> max(-5, -1.2) = -1.2; dual clip does not apply to A>0.
    batch, logprobs = pg_batch([5.0, 5.0], [-1.0, 1.0])
    loss_fn = ClippedPGLoss(cfg=LossConfig(ratio_clip_min=0.2, ratio_clip_max=0.2, ratio_clip_c=3.0))
    loss, _ = loss_fn(batch, logprobs, 2.0)
    assert float(loss) == pytest.approx((3.0 - 1.2) / 2)


def test_disable_ppo_ratio_is_plain_reinforce():
    # loss = -A * logp per token: logp = [-1, -2], A = [2, 2] -> (2 + 4) / 2 = 3
    batch, _ = pg_batch([1.0, 1.0], [2.0, 2.0])
    logprobs = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    loss_fn = ClippedPGLoss(cfg=LossConfig(disable_ppo_ratio=True))
    loss, _ = loss_fn(batch, logprobs, 2.0)
    assert float(loss.detach()) == pytest.approx(3.0)
    loss.backward()
    assert logprobs.grad.tolist() == [[-1.0, -1.0]]  # d/dlogp of -A*logp/2


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("k1", 0.5), ("k2", 0.125), ("k3", math.exp(-0.5) + 0.5 - 1.0)],
)
def test_kl_estimators(kind, expected):
    # log pi = -1, log pi_ref = -1.5: r = log pi_ref - log pi = -0.5
    # k1 = -r = 0.5; k2 = r^2/2 = 0.125; k3 = e^r - r - 1
    kl = kl_estimate(torch.tensor([-1.0]), torch.tensor([-1.5]), kind)
    assert float(kl) == pytest.approx(expected)


def test_kl_input_and_output_clamping():
    # r = -0.5 clamped to -0.3 -> k1 = 0.3; then k1 = 0.3 clamped to 0.1
    assert float(kl_estimate(torch.tensor([-1.0]), torch.tensor([-1.5]), "k1", input_clamp=0.3)) == pytest.approx(0.3)
    assert float(kl_estimate(torch.tensor([-1.0]), torch.tensor([-1.5]), "k1", 0.3, 0.1)) == pytest.approx(0.1)
    # k3 with r = +4 clamped to 2: e^2 - 2 - 1
    assert float(kl_estimate(torch.tensor([-5.0]), torch.tensor([-1.0]), "k3", 2.0)) == pytest.approx(math.exp(2) - 3)


def test_kl_penalty_term_in_loss():
    # A = 0 so only beta * k1 remains: logp = -1, ref = -1.5 -> k1 = 0.5; beta = 0.2 -> 0.1
    batch, logprobs = pg_batch([1.0], [0.0], reference_logprobs=torch.tensor([[-1.5]], dtype=torch.float64))
    batch["prev_logprobs"] = torch.tensor([[-1.0]], dtype=torch.float64)
    logprobs = torch.tensor([[-1.0]], dtype=torch.float64)
    cfg = LossConfig(reference_policy_kl_penalty=0.2, reference_policy_kl_type="k1")
    loss, metrics = ClippedPGLoss(cfg=cfg)(batch, logprobs, 1.0)
    assert float(loss) == pytest.approx(0.1)
    assert float(metrics["kl"]) == pytest.approx(0.5)


def test_importance_weights_truncated_and_applied_to_pg_and_kl():
    # prev = 0, generation logprob = -log 4: w = exp(0 + log 4) = 4, truncated (TIS) to 2.
    # ratio 1, A = 1: pg = -1; k1 with ref = -1 (logp = 0): k1 = 1, beta 0.5 -> 0.5
    # loss = w * (pg + beta * kl) = 2 * (-1 + 0.5) = -1
    batch, logprobs = pg_batch(
        [1.0],
        [1.0],
        generation_logprobs=torch.tensor([[-math.log(4.0)]], dtype=torch.float64),
        reference_logprobs=torch.tensor([[-1.0]], dtype=torch.float64),
    )
    cfg = LossConfig(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_ratio=2.0,
        reference_policy_kl_penalty=0.5,
        reference_policy_kl_type="k1",
    )
    loss, _ = ClippedPGLoss(cfg=cfg)(batch, logprobs, 1.0)
    assert float(loss) == pytest.approx(-1.0)


def test_on_policy_kl_approximation_weights_kl_by_ratio():
    # ratio = 2 (logp = log 2, prev = 0), A = 0; ref = log 2 - 1 -> k1 = 1; weighted by ratio 2; beta 1 -> 2
    batch, logprobs = pg_batch([2.0], [0.0])
    batch["reference_logprobs"] = logprobs - 1.0
    cfg = LossConfig(
        reference_policy_kl_penalty=1.0, reference_policy_kl_type="k1", use_on_policy_kl_approximation=True
    )
    loss, _ = ClippedPGLoss(cfg=cfg)(batch, logprobs, 1.0)
    assert float(loss) == pytest.approx(2.0)


def test_engine_logprob_drift_is_reported_without_gradient():
    # trainer logprobs [-1, -2, -3 (masked)], engine's [-1.5, -2, -9]: d = [0.5, 0, masked]
    # mean |d| = 0.5 / 2; k3 = exp(d) - d - 1 = [e^0.5 - 1.5, 0] -> (e^0.5 - 1.5) / 2
    batch, logprobs = pg_batch([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], prev=[-1.0, -2.0, -3.0])
    batch["loss_mask"] = torch.tensor([[1.0, 1.0, 0.0]])
    batch["generation_logprobs"] = torch.tensor([[-1.5, -2.0, -9.0]], dtype=torch.float64)
    logprobs.requires_grad_(True)
    loss_fn = ClippedPGLoss()
    _, metrics = loss_fn(batch, logprobs, loss_fn.count(batch))
    assert float(metrics["engine_logprob_abs_diff"]) == pytest.approx(0.25)
    assert float(metrics["engine_logprob_kl"]) == pytest.approx((math.exp(0.5) - 1.5) / 2)
    assert not metrics["engine_logprob_kl"].requires_grad


def test_token_level_vs_sequence_level_normalisation():
    # Plain REINFORCE per-token loss = -A * logp with logp = -1: the loss per token is A.
    # row 0: one valid token, A = 1; row 1: three valid tokens, A = 3.
    # token level: (1 + 3 + 3 + 3) / 4 tokens = 2.5; sequence level: (1 + 3) / 2 sequences = 2
    batch = {
        "input_ids": torch.zeros((2, 3), dtype=torch.long),
        "attention_mask": torch.ones((2, 3), dtype=torch.long),
        "loss_mask": torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]),
        "advantages": torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]]),
    }
    logprobs = -torch.ones((2, 3))
    for token_level, expected, count in ((True, 2.5, 4.0), (False, 2.0, 2.0)):
        fn = ClippedPGLoss(cfg=LossConfig(disable_ppo_ratio=True, token_level_loss=token_level))
        assert fn.count(batch) == count
        loss, _ = fn(batch, logprobs, fn.count(batch))
        assert float(loss) == pytest.approx(expected)


def test_sample_mask_drops_rows():
    batch = {
        "input_ids": torch.zeros((2, 1), dtype=torch.long),
        "attention_mask": torch.ones((2, 1), dtype=torch.long),
        "loss_mask": torch.ones((2, 1)),
        "advantages": torch.tensor([[1.0], [5.0]]),
        "sample_mask": torch.tensor([1.0, 0.0]),
    }
    fn = ClippedPGLoss(cfg=LossConfig(disable_ppo_ratio=True))
    assert fn.count(batch) == 1.0
    loss, _ = fn(batch, -torch.ones((2, 1)), 1.0)
    assert float(loss) == pytest.approx(1.0)


def test_nll():
    # -(-1 - 3) / 2 tokens = 2 (the masked -100 does not count)
    batch = {"input_ids": torch.zeros((1, 3), dtype=torch.long), "loss_mask": torch.tensor([[0.0, 1.0, 1.0]])}
    logprobs = torch.tensor([[-100.0, -1.0, -3.0]])
    fn = NLLLoss()
    loss, _ = fn(batch, logprobs, fn.count(batch))
    assert float(loss) == pytest.approx(2.0)


def test_dpo_loss_and_metrics():
    # chosen: seq logp -2 (ref -2.5); rejected: -3 (ref -2.5); beta 0.5
    # z = 0.5 * ((-2 + 2.5) - (-3 + 2.5)) = 0.5; loss = -log sigmoid(0.5) = log(1 + e^-0.5)
    batch = {
        "input_ids": torch.zeros((2, 2), dtype=torch.long),
        "loss_mask": torch.ones((2, 2)),
        "reference_logprobs": torch.tensor([[-1.0, -1.5], [-2.0, -0.5]]),
    }
    logprobs = torch.tensor([[-1.0, -1.0], [-1.0, -2.0]])
    fn = DPOLoss(beta=0.5)
    assert fn.count(batch) == 1
    loss, metrics = fn(batch, logprobs, 1.0)
    assert float(loss) == pytest.approx(math.log1p(math.exp(-0.5)))
    assert float(metrics["accuracy"]) == 1.0
    assert float(metrics["margin"]) == pytest.approx(1.0)


def test_dpo_reference_free_average_and_sft_term():
    # reference free, averaged logprobs: chosen mean -1, rejected mean -1.5 -> z = 1 * (-1 + 1.5) = 0.5
    # sft term: weight 0.1 * chosen mean NLL 1.0 = 0.1
    batch = {"input_ids": torch.zeros((2, 2), dtype=torch.long), "loss_mask": torch.ones((2, 2))}
    logprobs = torch.tensor([[-1.0, -1.0], [-1.0, -2.0]])
    fn = DPOLoss(beta=1.0, reference_free=True, average_log_probs=True, sft_loss_weight=0.1)
    loss, _ = fn(batch, logprobs, 1.0)
    assert float(loss) == pytest.approx(math.log1p(math.exp(-0.5)) + 0.1)


@pytest.mark.parametrize("loss", ["pg", "nll", "dpo"])
def test_a_batch_left_on_another_device_is_named_by_the_loss(loss):
    """What failed in the Megatron worker on CUDA (its micro-batches stayed on the CPU): the loss now names the key
    instead of a device-mismatch error deep in autograd."""
    from rl_core.base.errors import InputError
    from rl_core.training.losses import ClippedPGLoss, DPOLoss, NLLLoss

    batch = {
        "input_ids": torch.zeros(2, 3, dtype=torch.long),
        "attention_mask": torch.ones(2, 3, dtype=torch.long),
        "loss_mask": torch.ones(2, 3),
        "advantages": torch.ones(2, 3),
        "reference_logprobs": torch.zeros(2, 3),
    }
    fn = {"pg": ClippedPGLoss(), "nll": NLLLoss(), "dpo": DPOLoss()}[loss]
    elsewhere = torch.zeros(2, 3, device="meta")
    with pytest.raises(InputError, match=r"batch\['input_ids'\] is on cpu but the logprobs are on meta"):
        fn(batch, elsewhere, 1.0)


def test_bradley_terry_loss_accuracy_and_margin():
    # two pairs; each row's reward is its value at its one loss position:
    # pair 0: r_c = 2.0 (t2), r_r = 0.5 (t1) -> z = 1.5;  pair 1: r_c = -1.0 (t0), r_r = 1.0 (t2) -> z = -2.0
    # -log sigmoid(1.5) = log(1 + e^-1.5) = 0.201413;  -log sigmoid(-2) = log(1 + e^2) = 2.126928
    values = torch.tensor(
        [[9.0, 7.0, 2.0], [9.0, 0.5, 7.0], [-1.0, 9.0, 7.0], [9.0, 7.0, 1.0]], dtype=torch.float64, requires_grad=True
    )
    mask = torch.tensor([[0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.float64)
    batch = {"input_ids": torch.zeros(4, 3, dtype=torch.long), "loss_mask": mask}
    loss_fn = BradleyTerryLoss()
    assert loss_fn.count(batch) == 2
    loss, metrics = loss_fn(batch, values, 2.0)
    assert float(loss.detach()) == pytest.approx((0.201413 + 2.126928) / 2, abs=1e-6)
    assert float(metrics["accuracy"]) == 0.5
    assert float(metrics["reward_chosen"]) == pytest.approx(0.5)  # (2 - 1) / 2
    assert float(metrics["reward_gap"]) == pytest.approx(-0.25)  # (1.5 - 2) / 2
    loss.backward()
    # d/dr_c = -sigmoid(-z) / N: pair 0: -0.182426 / 2; only the loss positions get a gradient
    assert float(values.grad[0, 2]) == pytest.approx(-0.182426 / 2, abs=1e-6)
    assert float(values.grad[1, 1]) == pytest.approx(0.182426 / 2, abs=1e-6)
    assert float(values.grad[0, :2].abs().sum()) == 0.0
    # a margin of 1 on pair 0: z = 0.5 -> log(1 + e^-0.5) = 0.474077
    margin, _ = loss_fn({**batch, "margin": torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)}, values, 2.0)
    assert float(margin.detach()) == pytest.approx((0.474077 + 2.126928) / 2, abs=1e-6)


def test_policy_gradient_loss_ignores_logprobs_outside_the_loss_mask():
    # A backend may leave logprobs at 0 outside loss_mask; the previous logprobs there can be anything (-800 would
    # make exp(0 - (-800)) overflow in float64): the loss and its gradient are those of the masked tokens alone.
    # t1 (masked): r = 1, A = 2 -> -2;  t0 and t2 unmasked
    batch, _ = pg_batch([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], prev=[-800.0, -1.0, -900.0])
    batch["loss_mask"] = torch.tensor([[0.0, 1.0, 0.0]])
    batch["reference_logprobs"] = torch.full((1, 3), -1.0, dtype=torch.float64)
    leaky = torch.tensor([[0.0, -1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    cfg = LossConfig(reference_policy_kl_penalty=0.1, use_on_policy_kl_approximation=True)
    loss_fn = ClippedPGLoss(cfg=cfg)
    loss, metrics = loss_fn(batch, leaky, 1.0)
    assert float(loss.detach()) == pytest.approx(-2.0)  # the KL at t1 is 0 (logp = ref)
    loss.backward()
    assert torch.isfinite(leaky.grad).all() and all(torch.isfinite(v).all() for v in metrics.values())
    assert float(leaky.grad[0, 0]) == 0.0 and float(leaky.grad[0, 2]) == 0.0


def test_value_loss_clips_the_step_from_the_old_values():
    """v = (1.0, 0.5), v_old = (0.8, 0.0), R = (0.0, 1.0), clip 0.1 (position 0 masked out). Token 1: unclipped
    (1 - 0)^2 = 1 > clipped (0.9 - 0)^2 = 0.81; token 2: unclipped (0.5 - 1)^2 = 0.25 < clipped (0.1 - 1)^2 = 0.81.
    loss = 1/2 (1 + 0.81) / 2 = 0.4525; the gradient flows through token 1 only (v - R) / 2 = 0.5: token 2's
    clipped value does not move with v."""
    batch = {
        "input_ids": torch.zeros(1, 3, dtype=torch.long),
        "attention_mask": torch.ones(1, 3, dtype=torch.long),
        "loss_mask": torch.tensor([[0.0, 1.0, 1.0]]),
        "returns": torch.tensor([[0.0, 0.0, 1.0]]),
        "old_values": torch.tensor([[5.0, 0.8, 0.0]]),
    }
    values = torch.tensor([[-3.0, 1.0, 0.5]], requires_grad=True)
    loss_fn = ValueLoss(clip=0.1)
    loss, metrics = loss_fn(batch, values, loss_fn.count(batch))
    loss.backward()
    assert loss.item() == pytest.approx(0.4525)
    assert values.grad is not None and torch.allclose(values.grad, torch.tensor([[0.0, 0.5, 0.0]]))
    assert metrics["clip_fraction"].item() == pytest.approx(0.5)
    assert metrics["value"].item() == pytest.approx(0.75)
    unclipped, _ = ValueLoss(clip=None)(batch, values.detach(), 2.0)
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 0.25) / 2)


def seq_batch(log_ratios, advantages, **cfg):
    """Two-row batches whose rows may differ in length (``None`` pads): logprobs with gradients, prev = 0."""
    width = max(len(r) for r in log_ratios)
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (width - len(r)) for r in log_ratios])
    pad = [list(r) + [0.0] * (width - len(r)) for r in log_ratios]
    adv = [list(a) + [0.0] * (width - len(a)) for a in advantages]
    logprobs = torch.tensor(pad, dtype=torch.float64, requires_grad=True)
    batch = {
        "input_ids": torch.zeros(mask.shape, dtype=torch.long),
        "attention_mask": torch.ones(mask.shape, dtype=torch.long),
        "loss_mask": mask,
        "advantages": torch.tensor(adv, dtype=torch.float64),
        "prev_logprobs": torch.zeros(mask.shape, dtype=torch.float64),
    }
    loss_fn = ClippedPGLoss(cfg=LossConfig(**cfg))
    loss, metrics = loss_fn(batch, logprobs, loss_fn.count(batch))
    loss.backward()
    return float(loss.detach()), metrics, logprobs.grad


#: two rows of log-ratios and advantages: row 0's sequence ratio is clipped, row 1's is not
GSPO_ROWS = ([[math.log(2), 0.0], [math.log(1.1), 0.0]], [[1.0, 1.0], [1.0, 3.0]])


def test_gspo_clips_the_sequence_ratio_the_geometric_mean_of_its_tokens():
    # GSPO (Zheng et al. 2025): s_i = exp(mean_t log(pi/pi_old)); l_i = max(-A s_i, -A clip(s_i, 0.8, 1.2)),
    # averaged per sequence, then over sequences.
    # row 0: log-ratios [ln 2, 0] -> s = sqrt(2) = 1.4142 > 1.2, A = +1: clipped, -1.2 on each token, no gradient
    # row 1: log-ratios [ln 1.1, 0] -> s = sqrt(1.1) = 1.0488, A = [1, 3]: -A_t s per token, row mean -2 s
    # loss = (-1.2 + -2 s) / 2; d loss / d logp_t of row 1 = (1/2) * (-2 s) * ds/dlogp_t / s = (1/2)(-2 s)(1/2) = -s/2
    s = math.sqrt(1.1)
    loss, metrics, grad = seq_batch(*GSPO_ROWS, importance_ratio="sequence", token_level_loss=False)
    assert loss == pytest.approx((-1.2 - 2 * s) / 2)
    assert grad.tolist()[0] == [0.0, 0.0]
    assert grad.tolist()[1] == pytest.approx([-s / 2, -s / 2])
    assert float(metrics["ratio"]) == pytest.approx((math.sqrt(2) + s) / 2)
    assert float(metrics["clip_fraction"]) == pytest.approx(1 / 2)


def test_gspo_token_has_the_sequence_ratio_with_each_tokens_own_gradient():
    # GSPO-token: s_it = sg(s_i) pi_t / sg(pi_t): the value of s_i, d s_it / d logp_t = s_i.
    # row 1 as above: l = mean_t(-A_t s_it) -> d/dlogp_0 = (1/2)(1/2)(-1 s), d/dlogp_1 = (1/2)(1/2)(-3 s)
    # (GSPO gives both tokens -s/2: with equal advantages along a sequence the two agree)
    s = math.sqrt(1.1)
    loss, _, grad = seq_batch(*GSPO_ROWS, importance_ratio="sequence_token", token_level_loss=False)
    assert loss == pytest.approx((-1.2 - 2 * s) / 2)
    assert grad.tolist()[0] == [0.0, 0.0]
    assert grad.tolist()[1] == pytest.approx([-s / 4, -3 * s / 4])


def test_cispo_keeps_every_tokens_gradient_weighted_by_its_clipped_ratio():
    # CISPO (MiniMax-M1): l_t = -A_t sg(clip(r_t, 1 - 0.2, 1 + 0.28)) log pi_t, token mean over 3 tokens.
    # r = [0.5, 1.5, 1.1] -> w = [0.8, 1.28, 1.1]; A = [1, 1, -1]; log pi = ln r (prev = 0)
    # loss = (-0.8 ln 0.5 - 1.28 ln 1.5 + 1.1 ln 1.1) / 3; gradient -A_t w_t / 3 on every token: token 1 (r above
    # the clip, A > 0) keeps -1.28/3, where PPO's clip gives it none; token 2's weight has no gradient of its own
    logs = [[math.log(0.5), math.log(1.5), math.log(1.1)]]
    loss, metrics, grad = seq_batch(
        logs, [[1.0, 1.0, -1.0]], policy_objective="cispo", ratio_clip_min=0.2, ratio_clip_max=0.28
    )
    assert loss == pytest.approx((-0.8 * math.log(0.5) - 1.28 * math.log(1.5) + 1.1 * math.log(1.1)) / 3)
    assert grad.tolist()[0] == pytest.approx([-0.8 / 3, -1.28 / 3, 1.1 / 3])
    assert float(metrics["clip_fraction"]) == pytest.approx(2 / 3)
    _, _, ppo = seq_batch(logs, [[1.0, 1.0, -1.0]], ratio_clip_max=0.28)
    assert ppo.tolist()[0][1] == 0.0


def test_dr_grpo_divides_every_sequences_token_sum_by_one_constant():
    # Dr. GRPO (Liu et al. 2025): loss = sum_{i,t} l_it / (N_sequences * C). Ratios 1, so l = -A per token:
    # row 0: one token, A = 2; row 1: three tokens, A = 1 -> sum = -2 - 3 = -5.
    # C = 4: -5 / (2 * 4) = -0.625; token mean: -5 / 4; sequence mean: (-2 + -1) / 2
    rows, adv = [[0.0], [0.0, 0.0, 0.0]], [[2.0], [1.0, 1.0, 1.0]]
    assert seq_batch(rows, adv, constant_normalizer=4.0)[0] == pytest.approx(-0.625)
    assert seq_batch(rows, adv)[0] == pytest.approx(-1.25)
    assert seq_batch(rows, adv, token_level_loss=False)[0] == pytest.approx(-1.5)
    # each token's gradient is -A / (N * C) whatever its sequence's length (the token mean gives -A / 4)
    assert seq_batch(rows, adv, constant_normalizer=4.0)[2].flatten().tolist() == pytest.approx(
        [-0.25, 0, 0, *[-0.125] * 3]
    )


def test_mismatch_masks_drop_tokens_or_sequences_outside_their_bounds_and_say_how_many():
    # q = exp(logp_prev - logp_gen), prev = 0, ratios 1 (l = -A = -1 per token), the normaliser counts every token.
    # token mask, q = [1, 3, 0.25]: two-sided [0.5, 2] (IcePop) keeps token 0 -> -1/3, masked 2/3;
    # one-sided (high 2) keeps tokens 0 and 2 -> -2/3, masked 1/3
    gen = torch.tensor([[0.0, -math.log(3), math.log(4)]], dtype=torch.float64)

    def run(**cfg):
        batch, logprobs = pg_batch([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], generation_logprobs=gen)
        loss_fn = ClippedPGLoss(cfg=LossConfig(**cfg))
        loss, metrics = loss_fn(batch, logprobs, loss_fn.count(batch))
        return float(loss), float(metrics["mismatch_masked_fraction"])

    assert run(mismatch_mask="token", mismatch_mask_low=0.5, mismatch_mask_high=2.0) == pytest.approx((-1 / 3, 2 / 3))
    assert run(mismatch_mask="token", mismatch_mask_high=2.0) == pytest.approx((-2 / 3, 1 / 3))
    # sequence mask (high 1.5), geometric mean: log q = [ln 1.2, -ln 1.2] -> q = 1 (kept); [ln 4, ln 1.21] -> q =
    # sqrt(4 * 1.21) = 2.2 (dropped, its second token too): loss -2 / 4, half the tokens masked (a token mask would
    # keep that second token: -3 / 4)
    batch = {
        "input_ids": torch.zeros(2, 2, dtype=torch.long),
        "attention_mask": torch.ones(2, 2, dtype=torch.long),
        "loss_mask": torch.ones(2, 2),
        "advantages": torch.ones(2, 2, dtype=torch.float64),
        "prev_logprobs": torch.zeros(2, 2, dtype=torch.float64),
        "generation_logprobs": -torch.tensor([[math.log(1.2), -math.log(1.2)], [math.log(4), math.log(1.21)]]).double(),
    }
    loss_fn = ClippedPGLoss(cfg=LossConfig(mismatch_mask="sequence", mismatch_mask_high=1.5))
    loss, metrics = loss_fn(batch, torch.zeros(2, 2, dtype=torch.float64), loss_fn.count(batch))
    assert float(loss) == pytest.approx(-2 / 4) and float(metrics["mismatch_masked_fraction"]) == pytest.approx(1 / 2)
    without = {k: v for k, v in batch.items() if k != "generation_logprobs"}
    with pytest.raises(InputError, match="loss_fn.mismatch_mask compares with the engine's logprobs"):
        loss_fn(without, torch.zeros(2, 2, dtype=torch.float64), 4.0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"constant_normalizer": 4.0, "token_level_loss": False}, "constant_normalizer replaces"),
        ({"policy_objective": "cispo", "disable_ppo_ratio": True}, "drop disable_ppo_ratio"),
        ({"mismatch_mask": "token", "mismatch_mask_high": None}, "needs mismatch_mask_low or mismatch_mask_high"),
        ({"mismatch_mask_low": 2.0, "mismatch_mask_high": 2.0}, "must be below mismatch_mask_high"),
    ],
)
def test_loss_settings_that_contradict_each_other_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        LossConfig(**settings)
