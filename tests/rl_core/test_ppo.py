"""PPO's alignment of the critic with the policy's tokens, and its explained-variance figure."""

import pytest
import torch

from rl_core.algorithms.ppo import explained_variance, shift


def test_the_critic_is_read_one_position_before_each_action_token():
    """Actions at positions 2 and 3: the critic is read at 1 and 2 (its state holds the tokens before the action),
    and its head's outputs there become the values of the actions at 2 and 3."""
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0]])
    states = shift(mask, -1)
    assert torch.equal(states, torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0]]))
    head = torch.tensor([[10.0, 11.0, 12.0, 13.0, 14.0]])  # the score head at each position
    assert torch.equal(shift(head * states, 1) * mask, torch.tensor([[0.0, 0.0, 11.0, 12.0, 0.0]]))


def test_explained_variance():
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0]])
    returns = torch.tensor([[9.0, 1.0, 2.0, 3.0, 4.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0)
    assert explained_variance(returns, torch.ones_like(returns), mask) is None  # returns that do not vary
