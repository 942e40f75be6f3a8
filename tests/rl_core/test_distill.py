"""On-policy distillation's step as ``distill`` applies it: the teacher's per-token signal, plus the task reward's
leave-one-out advantage weighted by ``distill.task_reward_weight``."""

from types import SimpleNamespace

import pytest
import torch

from rl_core.algorithms import distill
from rl_core.training.context import Phases


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_distill_step_adds_the_weighted_task_advantage_to_the_teachers_signal(monkeypatch, weight):
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    on = SimpleNamespace(
        batch={"loss_mask": mask},
        scored=SimpleNamespace(examples=[{}], rewards=[1.0, 0.0]),
        logprobs=torch.tensor([[0.0, -1.0, -1.0], [0.0, -2.0, 0.0]]),
        phases=Phases(),
    )
    trained = {}
    monkeypatch.setattr(distill, "sample_on_policy", lambda ctx, cfg, sampler, step: on)
    monkeypatch.setattr(distill, "update_on_policy", lambda ctx, on, loss_fn: trained.update(on.batch) or {})
    teacher = torch.tensor([[0.0, -0.5, -2.0], [0.0, -1.0, 0.0]])
    ctx = SimpleNamespace(backend=SimpleNamespace(reference_logprobs=lambda batch: teacher))
    cfg = distill.DistillConfig(num_prompts_per_step=1, num_generations_per_prompt=2, task_reward_weight=weight)
    metrics = distill.distill_step(ctx, cfg, None, None, step=1)
    # -(log pi - log pi_T) per token; the task advantages (leave-one-out) are +1 and -1
    kl_signal = torch.tensor([[0.0, 0.5, -1.0], [0.0, 1.0, 0.0]])
    expected = (kl_signal + weight * torch.tensor([[1.0], [-1.0]])) * mask
    assert torch.allclose(trained["advantages"], expected)
    assert metrics["distill/reverse_kl"] == pytest.approx((-0.5 + 1.0 - 1.0) / 3)  # log pi - log pi_T, per token
