"""Advantage estimators on a small reward matrix worked out by hand."""

import math

import pytest
import torch

from rl_core.training.advantages import (
    distillation_advantages,
    gae,
    group_advantages,
    kl_penalized_rewards,
    kl_to_go,
    last_position,
    masked_whiten,
    overlong_penalty,
)

REWARDS = torch.tensor(
    [
        [1.0, 0.0, 1.0, 0.0],  # mean 0.5
        [2.0, 2.0, 2.0, 2.0],  # all equal: zero std
        [1.0, 0.0, 5.0, 100.0],  # last sample masked: mean of (1, 0, 5) = 2
        [3.0, 7.0, 7.0, 7.0],  # only the first is valid
    ]
)
VALID = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)


def test_mean_baseline():
    adv = group_advantages(REWARDS, VALID, leave_one_out=False, normalize=False)
    expected = [[0.5, -0.5, 0.5, -0.5], [0, 0, 0, 0], [-1, -2, 3, 0], [0, 0, 0, 0]]
    assert adv.tolist() == expected


def test_leave_one_out_baseline():
    # group 0: b_i = (2 - r_i) / 3 -> [1/3, 2/3, 1/3, 2/3]; A = [2/3, -2/3, 2/3, -2/3]
    # group 2: b_i = (6 - r_i) / 2 -> [2.5, 3, 0.5]; A = [-1.5, -3, 4.5], masked 0
    adv = group_advantages(REWARDS, VALID, leave_one_out=True, normalize=False)
    assert adv[0].tolist() == pytest.approx([2 / 3, -2 / 3, 2 / 3, -2 / 3])
    assert adv[2].tolist() == pytest.approx([-1.5, -3.0, 4.5, 0.0])
    assert adv[1].tolist() == [0, 0, 0, 0] and adv[3].tolist() == [0, 0, 0, 0]


def test_std_normalisation_with_masked_and_degenerate_groups():
    # group 0: unbiased std = sqrt(4 * 0.25 / 3) = sqrt(1/3); 0.5 / sqrt(1/3) = 0.8660...
    # group 2: std = sqrt((1 + 4 + 9) / 2) = sqrt(7)
    adv = group_advantages(REWARDS, VALID, leave_one_out=False, normalize=True, eps=0.0)
    assert adv[0].tolist() == pytest.approx([0.5 / math.sqrt(1 / 3), -0.5 / math.sqrt(1 / 3)] * 2)
    assert adv[2].tolist() == pytest.approx([-1 / math.sqrt(7), -2 / math.sqrt(7), 3 / math.sqrt(7), 0.0])
    assert not torch.isnan(adv).any()
    assert adv[1].tolist() == [0, 0, 0, 0] and adv[3].tolist() == [0, 0, 0, 0]


def test_kl_penalized_rewards():
    # r - beta * sum_t m (logp - ref): 1 - 0.1 * ((-1 + 2) + (-1 + 1.5)) = 1 - 0.15
    out = kl_penalized_rewards(
        torch.tensor([1.0]),
        torch.tensor([[-1.0, -1.0, -9.0]]),
        torch.tensor([[-2.0, -1.5, 0.0]]),
        torch.tensor([[1.0, 1.0, 0.0]]),
        0.1,
    )
    assert out.tolist() == pytest.approx([0.85])


def test_overlong_penalty():
    # max 10, buffer 4: no penalty up to 6; 8 -> -0.5 * 1; 10 and beyond -> -1
    out = overlong_penalty(torch.tensor([3, 6, 8, 10, 12]), max_length=10, buffer=4, penalty=1.0)
    assert out.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]


STUDENT = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-3.0, -0.1, 0.0, 0.0]])  # [N=2, T=4] sampled tokens' logprobs
TEACHER = torch.tensor([[-0.5, -4.0, -0.5, -7.0], [-1.0, -0.1, -2.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])  # row 0: 3 response tokens; row 1: 1, mid-row


def test_distillation_advantage_is_each_tokens_negative_reverse_kl():
    # -(s - t): row 0: -(-1 + 0.5) = 0.5, -(-2 + 4) = -2, -(-0.5 + 0.5) = 0, padding 0
    # row 1: only token 1 counts: -(-0.1 + 0.1) = 0; the teacher's -2 on a masked token is ignored
    out = distillation_advantages(STUDENT, TEACHER, MASK)
    torch.testing.assert_close(out, torch.tensor([[0.5, -2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))


def test_distillation_advantage_mixes_a_task_advantage_per_sample():
    # w = 0.5, task A = [1, -2]: row 0 adds 0.5 to each response token; row 1 adds -1 to its one token
    out = distillation_advantages(STUDENT, TEACHER, MASK, torch.tensor([1.0, -2.0]), 0.5)
    torch.testing.assert_close(out, torch.tensor([[1.0, -1.5, 0.5, 0.0], [0.0, -1.0, 0.0, 0.0]]))
    # weight 0: the task advantage is ignored entirely
    assert distillation_advantages(STUDENT, TEACHER, MASK, torch.tensor([1.0, -2.0]), 0.0).equal(
        distillation_advantages(STUDENT, TEACHER, MASK)
    )


def test_distillation_advantage_is_zero_where_student_and_teacher_agree():
    assert distillation_advantages(STUDENT, STUDENT, torch.ones_like(MASK)).abs().max() == 0


# GAE, worked out by hand: a response of three action tokens (positions 1..3) with its reward at the last
ONE_MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
ONE_REWARD = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
ONE_VALUES = torch.tensor([[0.0, 0.5, 0.6, 0.7]])


def test_gae_with_gamma_and_lambda_one_gives_monte_carlo_returns():
    # delta_3 = 1 - 0.7 = 0.3; delta_2 = 0.7 - 0.6 = 0.1; delta_1 = 0.6 - 0.5 = 0.1; A_t = sum of deltas from t
    advantages, returns = gae(ONE_REWARD, ONE_VALUES, ONE_MASK, gamma=1.0, lam=1.0)
    assert torch.allclose(advantages, torch.tensor([[0.0, 0.5, 0.4, 0.3]]))
    assert torch.allclose(returns, torch.tensor([[0.0, 1.0, 1.0, 1.0]]))


def test_gae_discounts_and_lambda_weights_the_deltas():
    # gamma 0.9, lam 0.5: delta_3 = 0.3, A_3 = 0.3; delta_2 = 0.9 * 0.7 - 0.6 = 0.03, A_2 = 0.03 + 0.45 * 0.3 = 0.165;
    # delta_1 = 0.9 * 0.6 - 0.5 = 0.04, A_1 = 0.04 + 0.45 * 0.165 = 0.11425
    advantages, returns = gae(ONE_REWARD, ONE_VALUES, ONE_MASK, gamma=0.9, lam=0.5)
    assert torch.allclose(advantages, torch.tensor([[0.0, 0.11425, 0.165, 0.3]]))
    assert torch.allclose(returns, torch.tensor([[0.0, 0.61425, 0.765, 1.0]]))


def test_gae_skips_observation_tokens_and_ends_each_episode_at_its_last_action():
    """Row a: actions at 1, 2 and 4 (3 is an environment's observation, 5 padding), reward 2 at 4; row b: actions
    at 2 and 3 then its episode ends, reward -1 at 3; row c: no action. Values off the actions (9, 7) are never
    read. gamma 0.5, lam 1: the discounted return of each action counts its row's actions only."""
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    rewards = torch.tensor([[0, 0, 0, 0, 2.0, 0], [0, 0, 0, -1.0, 0, 0], [0.0] * 6])
    values = torch.tensor([[0, 1, 1, 9, 1, 9], [7, 7, 0.5, -0.5, 7, 7], [3.0] * 6])
    advantages, returns = gae(rewards, values, mask, gamma=0.5, lam=1.0)
    # a: A_4 = 2 - 1 = 1; A_2 = (0.5 * 1 - 1) + 0.5 * 1 = 0; A_1 = (0.5 * 1 - 1) + 0.5 * 0 = -0.5
    # b: A_3 = -1 + 0.5 = -0.5; A_2 = (0.5 * -0.5 - 0.5) + 0.5 * -0.5 = -1.0
    assert torch.allclose(advantages, torch.tensor([[0, -0.5, 0, 0, 1, 0], [0, 0, -1.0, -0.5, 0, 0], [0.0] * 6]))
    assert torch.allclose(returns, torch.tensor([[0, 0.5, 1, 0, 2, 0], [0, 0, -0.5, -1, 0, 0], [0.0] * 6]))


def test_masked_whiten_uses_the_masked_positions_only():
    values = torch.tensor([[100.0, 1.0, 2.0], [3.0, -50.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # mean 2, unbiased variance ((1-2)^2 + 0 + (3-2)^2) / 2 = 1
    assert torch.allclose(masked_whiten(values, mask), torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0]]), atol=1e-6)
    assert torch.equal(masked_whiten(values, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])), torch.zeros(2, 3))


def test_last_position_marks_each_rows_last_action():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    expected = torch.tensor([[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    assert torch.equal(last_position(mask), expected)


def test_reinforce_plus_plus_kl_return_sums_each_tokens_kl_from_it_on():
    # REINFORCE++ (Hu 2025): r_t = -beta * KL_t per token (the task reward at the end), undiscounted returns:
    # K_t = sum_{s >= t} m_s (logp_s - logp_ref_s). logp - ref = [0.1, 0.2, 0.3], mask [1, 1, 0] -> [0.3, 0.2, 0]
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = logp - torch.tensor([[0.1, 0.2, 0.3]])
    out = kl_to_go(logp, ref, torch.tensor([[1.0, 1.0, 0.0]]))
    assert out[0].tolist() == pytest.approx([0.3, 0.2, 0.0])


def test_raw_rewards_leave_no_group_baseline_to_normalise():
    from rl_core.algorithms.grpo import GRPOConfig

    assert GRPOConfig(group_baseline=False, normalize_rewards=False).group_baseline is False
    with pytest.raises(ValueError, match="grpo.group_baseline=false uses the raw rewards"):
        GRPOConfig(group_baseline=False)
