"""PPO's alignment of the critic with the policy's tokens, its KL penalty in the reward, and its explained-variance
figure."""

import pytest
import torch

from rl_core.algorithms.ppo import explained_variance


class Critic:
    """A score head whose output at position ``t`` is ``10 + t``; keeps what it was asked and trained on."""

    def __init__(self) -> None:
        self.read: torch.Tensor | None = None
        self.trained: dict | None = None

    def logprobs(self, rows):
        self.read = rows["loss_mask"]
        return (10.0 + torch.arange(rows["input_ids"].shape[1], dtype=torch.float32)) * rows["loss_mask"]

    def train(self, batch, loss_fn):
        self.trained = batch
        return {"loss": 0.0}


def test_ppo_step_reads_the_critic_one_position_before_each_action_token(monkeypatch):
    """``ppo_step`` itself, on one row with actions at positions 2 and 3 and reward 1: the critic is read at 1 and 2
    (its state holds the tokens before the action), its outputs there (11, 12) are the actions' values, and it is
    trained at those same positions towards the returns (gamma = lam = 1: the reward, 1, at both)."""
    from types import SimpleNamespace

    from rl_core.algorithms import ppo
    from rl_core.training.context import Phases

    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0]])
    batch = {"input_ids": torch.tensor([[5, 6, 7, 8, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 1, 0]])}
    on = SimpleNamespace(
        batch={**batch, "loss_mask": mask},
        scored=SimpleNamespace(rewards=[1.0]),
        logprobs=torch.zeros(1, 5),
        metrics={},
        phases=Phases(),
        start=0.0,
    )
    monkeypatch.setattr(ppo, "sample_on_policy", lambda ctx, cfg, sampler, step: on)
    critic = Critic()
    ctx = SimpleNamespace(critic=critic, backend=None)
    cfg = ppo.PPOConfig(gamma=1.0, lam=1.0, critic=ppo.CriticConfig(warmup_steps=1))
    from rl_core.base.schema import LossConfig

    pg_loss, value_loss = ppo.ClippedPGLoss(cfg=LossConfig()), ppo.ValueLoss(clip=None)
    metrics = ppo.ppo_step(ctx, cfg, None, pg_loss, value_loss, step=1)  # a critic-only step
    assert torch.equal(critic.read, torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0]]))
    trained = critic.trained
    assert torch.equal(trained["loss_mask"], critic.read)
    assert torch.equal(trained["old_values"], torch.tensor([[0.0, 11.0, 12.0, 0.0, 0.0]]))
    assert torch.equal(trained["returns"], torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0]]))
    assert metrics["ppo/shaped_reward"] == 1.0 and "advantages" not in on.batch


def test_ppo_step_subtracts_kl_penalty_times_each_tokens_logprob_gap_to_the_reference(monkeypatch):
    """``ppo.kl_penalty=0.5``: the action tokens' rewards become ``-0.5 * (log pi - log pi_ref)`` plus the final
    reward at the last one; with gamma = lam = 1 the critic's return at each action is the sum from it on."""
    from types import SimpleNamespace

    from rl_core.algorithms import ppo
    from rl_core.base.schema import LossConfig
    from rl_core.training.context import Phases

    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0]])
    batch = {"input_ids": torch.tensor([[5, 6, 7, 8, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 1, 0]])}
    on = SimpleNamespace(
        batch={**batch, "loss_mask": mask},
        scored=SimpleNamespace(rewards=[1.0]),
        logprobs=torch.tensor([[0.0, 0.0, -1.0, -2.0, 0.0]]),
        metrics={},
        phases=Phases(),
        start=0.0,
    )
    monkeypatch.setattr(ppo, "sample_on_policy", lambda ctx, cfg, sampler, step: on)
    reference = SimpleNamespace(reference_logprobs=lambda b: torch.tensor([[0.0, 0.0, -2.0, -1.0, 0.0]]))
    critic = Critic()
    ctx = SimpleNamespace(critic=critic, backend=reference)
    cfg = ppo.PPOConfig(gamma=1.0, lam=1.0, kl_penalty=0.5, critic=ppo.CriticConfig(warmup_steps=1))
    pg_loss, value_loss = ppo.ClippedPGLoss(cfg=LossConfig()), ppo.ValueLoss(clip=None)
    metrics = ppo.ppo_step(ctx, cfg, None, pg_loss, value_loss, step=1)
    # token rewards: -0.5 * (-1 - -2) = -0.5 at position 2; 1 - 0.5 * (-2 - -1) = 1.5 at position 3
    assert metrics["ppo/shaped_reward"] == pytest.approx(1.0)
    assert torch.allclose(critic.trained["returns"], torch.tensor([[0.0, 1.0, 1.5, 0.0, 0.0]]))


def test_explained_variance():
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0]])
    returns = torch.tensor([[9.0, 1.0, 2.0, 3.0, 4.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0)
    assert explained_variance(returns, torch.ones_like(returns), mask) is None  # returns that do not vary
