"""GRPO's DAPO options and baselines as ``grpo`` itself applies them to a step's scored rollouts: dynamic sampling
(``collect``), overlong shaping and filtering and the leave-one-out baseline (``sample_advantages``)."""

from types import SimpleNamespace

import attrs
import pytest
import torch

from rl_core.algorithms import grpo
from rl_core.base.schema import LossConfig
from rl_core.contracts.protocols import Rollout
from rl_core.training.context import Phases
from rl_core.training.losses import ClippedPGLoss
from rl_core.training.rollouts import ScoredRollouts


def scored(groups: list[list[float]], lengths: list[list[int]] | None = None, limit: int = 8) -> ScoredRollouts:
    """One draw: prompt ``p`` is named ``f"p{p}"``; its rollouts have the given rewards and response lengths (a
    response of ``limit`` tokens was cut there)."""
    lengths = lengths or [[2] * len(g) for g in groups]
    rollouts = [
        Rollout(
            prompt_index=p,
            sample_index=i,
            prompt_token_ids=(1,),
            token_ids=tuple(range(n)),
            text="",
            logprobs=(0.0,) * n,
            finish_reason="length" if n >= limit else "stop",
        )
        for p, group in enumerate(lengths)
        for i, n in enumerate(group)
    ]
    return ScoredRollouts(
        examples=[{"prompt": f"p{p}"} for p in range(len(groups))],
        rollouts=rollouts,
        rewards=[r for g in groups for r in g],
        metrics={"reward": 0.0},
        transcripts=[{"prompt": f"p{p}", "i": i} for p, g in enumerate(groups) for i in range(len(g))],
    )


def test_dynamic_sampling_keeps_groups_whose_rewards_differ_and_draws_more_until_the_step_is_full(monkeypatch):
    draws = iter(
        [
            scored([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]),  # only p1 has signal
            scored([[0.0, 0.0], [1.0, 0.0], [0.5, 0.0]]),  # p1 and p2 (one more than the step needs)
        ]
    )
    monkeypatch.setattr(grpo, "generate_and_score", lambda *args: next(draws))
    sampler = SimpleNamespace(next=lambda: [])
    cfg = grpo.GRPOConfig(num_prompts_per_step=2, num_generations_per_prompt=2, dynamic_sampling=True)
    out = grpo.collect(None, cfg, sampler, SimpleNamespace(n=2), Phases())
    assert out.rewards == [0.0, 1.0, 1.0, 0.0]  # draw 1's p1, then draw 2's p1; draw 2's p2 is left over
    assert [r.prompt_index for r in out.rollouts] == [0, 0, 1, 1]  # renumbered to the kept groups
    assert [t["i"] for t in out.transcripts] == [0, 1, 0, 1] and len(out.examples) == 2
    assert out.metrics["dynamic_sampling/kept_groups"] == 2.0


def test_dynamic_sampling_stops_after_its_draw_limit_and_trains_on_what_it_kept(monkeypatch):
    calls = []

    def draw(*args):
        calls.append(1)
        return scored([[1.0, 1.0], [0.0, 1.0]]) if len(calls) == 1 else scored([[0.0, 0.0], [1.0, 1.0]])

    monkeypatch.setattr(grpo, "generate_and_score", draw)
    cfg = grpo.GRPOConfig(
        num_prompts_per_step=2, num_generations_per_prompt=2, dynamic_sampling=True, dynamic_sampling_max_gen_batches=3
    )
    out = grpo.collect(None, cfg, SimpleNamespace(next=lambda: []), SimpleNamespace(n=2), Phases())
    assert len(calls) == 3 and out.rewards == [0.0, 1.0]
    assert out.metrics["dynamic_sampling/kept_groups"] == 1.0


def ctx(max_new_tokens: int = 8) -> SimpleNamespace:
    return SimpleNamespace(
        config=SimpleNamespace(policy=SimpleNamespace(generation=SimpleNamespace(max_new_tokens=max_new_tokens)))
    )


def test_overlong_shaping_penalises_the_last_buffer_tokens_and_filtering_drops_cut_responses():
    # limit 8, buffer 4: lengths 2, 4 are free, 6 pays (6 - 4) / 4 = 0.5, 8 (cut at the limit) pays 1
    rollouts = scored([[1.0, 1.0, 1.0, 1.0]], lengths=[[2, 4, 6, 8]])
    cfg = grpo.GRPOConfig(
        num_prompts_per_step=1,
        num_generations_per_prompt=4,
        overlong_reward_shaping=True,
        overlong_buffer_length=4,
        overlong_filtering=True,
        normalize_rewards=False,
    )
    rewards, advantages, valid = grpo.sample_advantages(ctx(), cfg, rollouts)
    assert rewards.tolist() == [[1.0, 1.0, 0.5, 0.0]]
    assert valid.tolist() == [[True, True, True, False]]
    # the baseline is the mean over the valid three (2.5 / 3); the cut response gets no advantage
    assert advantages[0, :3].tolist() == pytest.approx([1 / 6, 1 / 6, -1 / 3])
    assert advantages[0, 3] == 0.0


def test_leave_one_out_baseline_is_the_mean_of_the_groups_other_rewards():
    rollouts = scored([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 3.0]])
    cfg = grpo.GRPOConfig(
        num_prompts_per_step=2, num_generations_per_prompt=4, use_leave_one_out_baseline=True, normalize_rewards=False
    )
    _, advantages, _ = grpo.sample_advantages(ctx(), cfg, rollouts)
    expected = torch.tensor([[1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3], [-1.0, -1.0, -1.0, 3.0]])
    assert torch.allclose(advantages, expected)


@pytest.mark.parametrize(
    ("rows", "on_policy", "overrides", "expected"),
    [
        # one optimizer step on-policy: no pass before training; the training forward measures the mismatch
        (16, True, {}, dict(current=False, prev=False, check=False, check_in_training=True, reference=False)),
        # several steps on one batch: the PPO ratio needs prev logprobs, and that pass measures the mismatch
        (32, True, {}, dict(current=True, prev=True, check=True, check_in_training=False, reference=False)),
        # an off-policy batch: no mismatch check anywhere (the engine's weights were not the trainer's)
        (32, False, {}, dict(current=True, prev=True, check=False, check_in_training=False, reference=False)),
        (16, False, {}, dict(current=False, prev=False, check=False, check_in_training=False, reference=False)),
        # the reward's KL needs the current logprobs and the reference's, even with one step
        (
            16,
            True,
            {"reward_kl_penalty": 0.1},
            dict(current=True, prev=False, check=False, check_in_training=True, reference=True),
        ),
        # several steps without the ratio: no prev; the first step's mismatch is checked on its due steps
        (
            32,
            True,
            {"disable_ppo_ratio": True},
            dict(current=True, prev=False, check=True, check_in_training=False, reference=False),
        ),
        (
            16,
            True,
            {"reference_policy_kl_penalty": 0.1},
            dict(current=False, prev=False, check=False, check_in_training=True, reference=True),
        ),
    ],
)
def test_a_grpo_step_runs_the_logprob_passes_it_needs_and_checks_the_mismatch_once(
    rows, on_policy, overrides, expected
):
    loss_keys = {k: v for k, v in overrides.items() if k in attrs.fields_dict(LossConfig)}
    cfg = grpo.GRPOConfig(**{k: v for k, v in overrides.items() if k not in loss_keys})
    config = SimpleNamespace(
        policy=SimpleNamespace(train_global_batch_size=16), health=SimpleNamespace(logprob_mismatch_every=1)
    )
    passes = grpo.logprob_passes(
        SimpleNamespace(config=config), cfg, LossConfig(**loss_keys), rows, 1, on_policy=on_policy
    )
    assert attrs.asdict(passes) == expected


class CapturingBackend:
    """Answers the passes with fixed logprobs and keeps the batch it is asked to train on."""

    def __init__(self, current: torch.Tensor, reference: torch.Tensor) -> None:
        self.current, self.reference, self.trained = current, reference, None

    def logprobs(self, batch):
        return self.current.clone()

    def reference_logprobs(self, batch):
        return self.reference.clone()

    def train(self, batch, loss_fn):
        self.trained = batch
        return {}


def test_reinforce_plus_plus_subtracts_the_kl_to_go_then_whitens_over_the_kept_samples_only():
    """REINFORCE++ as GRPO's step wires it (``train_on``): raw rewards (no group baseline), each token's advantage the
    reward minus beta times the KL to the reference still to come, whitened over the loss tokens of the samples that
    count. Worked by hand: one prompt, three samples of two response tokens after a one-token prompt; rewards
    [1, 0, 5], the third cut at the limit and so dropped (overlong filtering); log pi - log ref = 0.5 on every response
    token, beta = 0.2: KL to go [1.0, 0.5] -> advantages [1 - 0.2, 1 - 0.1] = [0.8, 0.9] and [-0.2, -0.1]; whitened
    over those four tokens alone: mean 0.35, unbiased variance (0.45^2 + 0.55^2 + 0.55^2 + 0.45^2) / 3 = 1.01 / 3."""
    rewards, lengths = [[1.0, 0.0, 5.0]], [[2, 2, 8]]
    step = scored(rewards, lengths)
    step.rollouts[2] = attrs.evolve(step.rollouts[2], token_ids=(0, 1), logprobs=(0.0, 0.0), finish_reason="length")
    width = 3  # the prompt token and two response tokens
    current = torch.zeros(3, width)
    current[:, 1:] = 0.5
    backend = CapturingBackend(current, torch.zeros(3, width))
    config = SimpleNamespace(
        policy=SimpleNamespace(
            train_global_batch_size=3, max_total_sequence_length=16, generation=SimpleNamespace(max_new_tokens=8)
        ),
        health=SimpleNamespace(logprob_mismatch_every=0),
    )
    ctx = SimpleNamespace(config=config, backend=backend, tokenizer=SimpleNamespace(pad_token_id=0))
    cfg = grpo.GRPOConfig(
        num_generations_per_prompt=3,
        group_baseline=False,
        normalize_rewards=False,
        reward_kl_penalty=0.2,
        batch_normalize_advantages=True,
        overlong_filtering=True,
    )
    loss_fn = ClippedPGLoss(cfg=LossConfig(disable_ppo_ratio=True))
    grpo.train_on(ctx, cfg, step, loss_fn, 1, Phases(), on_policy=True)
    batch = backend.trained
    assert batch["sample_mask"].tolist() == [1.0, 1.0, 0.0]
    kept = torch.tensor([0.8, 0.9, -0.2, -0.1])
    whitened = ((kept - 0.35) / (1.01 / 3 + 1e-8) ** 0.5).tolist()
    assert batch["advantages"][:2, 1:].flatten().tolist() == pytest.approx(whitened, abs=1e-5)
    assert sum(whitened) == pytest.approx(0.0, abs=1e-6)
