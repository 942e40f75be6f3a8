"""Whether a run can learn, from its first step: the learning-signal figures of a step's scored rollouts
(``signal/*`` in ``metrics.jsonl``), and warnings with the likely fix while they say nothing can be learned: a
reward that never fires, responses cut at their token limit, groups whose rewards are all equal (no group-relative
advantage), a reward that every sample gets. Each is said by step 3 and again every ``REPEAT`` steps while it
lasts, never per step. Truncation is judged on the last steps (responses may grow into the limit); the others only
while they have held since step 1 (a run that learned its task ends with equal, saturated groups, and that is no
alarm)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from rl_core.base.errors import InputError
from rl_core.contracts.protocols import Rollout

#: steps a condition must hold (the first check is at this step), and steps between two warnings of one kind
WINDOW, REPEAT = 3, 20
#: the share of responses cut at the token limit that is warned
TRUNCATED = 0.9


def limit_setting(config: Any) -> tuple[str, int]:
    """The config key that limits a response, and its value: an episode's turn's
    (``environment.max_tokens_per_turn``), else ``policy.generation.max_new_tokens``."""
    turn = config.environment.max_tokens_per_turn if config.environment.name else None
    if turn is not None:
        return "environment.max_tokens_per_turn", int(turn)
    return "policy.generation.max_new_tokens", int(config.policy.generation.max_new_tokens)


def signal_metrics(rollouts: Sequence[Rollout], rewards: Sequence[float], limit: int | None) -> dict[str, float]:
    """A step's figures: samples, the share with a non-zero reward, the rewards' spread (max - min), the mean
    response length as a share of ``limit`` (its token limit, when known) and, where prompts have several samples,
    the share of prompts whose samples' rewards are all equal."""
    n = max(len(rewards), 1)
    out = {
        "signal/samples": float(len(rewards)),
        "signal/reward_nonzero": sum(r != 0 for r in rewards) / n,
        "signal/reward_spread": (max(rewards) - min(rewards)) if rewards else 0.0,
    }
    if limit is not None:
        out["signal/length_of_limit"] = sum(len(r.token_ids) for r in rollouts) / n / max(limit, 1)
    groups: dict[int, list[float]] = {}
    for rollout, reward in zip(rollouts, rewards, strict=True):
        groups.setdefault(rollout.prompt_index, []).append(reward)
    if groups and min(len(g) for g in groups.values()) > 1:
        out["signal/equal_reward_groups"] = sum(len(set(g)) == 1 for g in groups.values()) / len(groups)
    return out


@attrs.define
class SignalWatch:
    """Reads each step's figures and says, with the fix, when they show the run cannot learn."""

    #: how the run limits a response: the config key and its value
    limit_key: str
    limit: int
    warn: Callable[[str], None]
    window: list[Mapping[str, float]] = attrs.Factory(list)
    #: each reward source's non-zero samples and all samples since step 1
    fired: dict[str, float] = attrs.Factory(dict)
    samples: float = 0.0
    #: the step each kind of warning was last said
    said: dict[str, int] = attrs.Factory(dict)
    #: whether each rewards' condition (``saturated``, ``zero``, ``equal``) has held on every step since step 1
    held: dict[str, bool] = attrs.Factory(dict)
    #: a response of the latest step, for the warning that a reward never fires
    sample: Mapping[str, Any] | None = None

    def saw(self, transcripts: Sequence[Mapping[str, Any]]) -> None:
        if transcripts:
            self.sample = transcripts[0]

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        if "signal/samples" not in metrics:
            return
        self.window = [*self.window, metrics][-WINDOW:]
        n = metrics["signal/samples"]
        self.samples += n
        for key, share in metrics.items():
            if key.startswith("signal/fired/"):
                name = key.removeprefix("signal/fired/")
                self.fired[name] = self.fired.get(name, 0.0) + share * n
        flat = metrics["signal/reward_spread"] == 0
        for kind, now in (
            ("saturated", flat and metrics.get("reward", 0.0) != 0),
            ("zero", flat and metrics.get("reward", 0.0) == 0),
            ("equal", not flat and metrics.get("signal/equal_reward_groups", 0.0) == 1.0),
        ):
            self.held[kind] = self.held.get(kind, True) and now
        if len(self.window) < WINDOW:
            return
        for kind, message in self._findings():
            if kind not in self.said or step - self.said[kind] >= REPEAT:
                self.said[kind] = step
                self.warn(f"step {step}: {message}")

    def _findings(self) -> list[tuple[str, str]]:
        w, out = self.window, []
        steps = f"the last {WINDOW} steps"
        total = int(self.samples)
        for name, count in self.fired.items():
            if count == 0:
                out.append((f"fired/{name}", f"{total} of {total} samples scored 0 on {name!r}{self._example()}: "
                            "nothing to learn from; check that the reward reads what the model writes (the "
                            "answer's format, data.answer_key) or teach the format first (warmup_recipe)"))  # fmt: skip
        cut = sum(m.get("truncated_fraction", 0.0) for m in w) / WINDOW
        if cut >= TRUNCATED:
            out.append(("truncated", f"{cut:.0%} of responses hit {self.limit_key}={self.limit} over {steps}: "
                        "raise it (a cut response rarely earns its reward)"))  # fmt: skip
        since = "since step 1"
        if self.held["saturated"]:
            out.append(("saturated", f"every sample scored {w[-1]['reward']:.4g} {since}: nothing left to learn "
                        "(the task is too easy for this model, or the reward ignores the response)"))  # fmt: skip
        if self.held["zero"] and not self.fired:
            out.append(("zero", f"every sample scored 0 {since}{self._example()}: nothing to learn from"))
        if self.held["equal"]:
            out.append(("equal", f"no group has reward variance {since} (each prompt's samples scored alike): "
                        "the group-relative advantages are all 0 and nothing is learned; raise "
                        "grpo.num_generations_per_prompt or policy.generation.temperature, or give the reward "
                        "partial credit"))  # fmt: skip
        return out

    def preflight(self, rollouts: Sequence[Rollout], rewards: Sequence[float], fired: Mapping[str, float],
                  mode: str, say: Callable[[str], None]) -> None:  # fmt: skip
        """Step 1's rollouts before the first update: one line (``say``) of their rewards, truncation and groups;
        without any learning signal, the fix, warned or (``mode == "stop"``) raised as an ``InputError``."""
        if mode == "off" or not rewards:
            return
        f = signal_metrics(rollouts, rewards, self.limit)
        n = len(rewards)
        cut = sum(r.finish_reason == "length" for r in rollouts) / n
        sources = ", ".join(f"{name} {share:.0%}" for name, share in fired.items())
        groups = f.get("signal/equal_reward_groups")
        say(
            f"preflight: step 1's {n} samples, before any update: reward mean {sum(rewards) / n:.3g}, non-zero "
            f"{f['signal/reward_nonzero']:.0%}{f' ({sources})' if sources else ''}, cut at {self.limit_key} {cut:.0%}"
            + (f", prompts whose samples all scored alike {groups:.0%}" if groups is not None else "")
        )
        if f["signal/reward_spread"] != 0 and groups != 1.0:
            return
        fixes = []
        if cut >= 0.5:
            fixes.append(f"raise {self.limit_key} ({cut:.0%} of the responses were cut at {self.limit})")
        if f["signal/reward_spread"] == 0 and rewards[0] == 0:
            fixes.append("check that the reward reads what the model writes (the answer's format, data.answer_key), "
                         "or teach the format first (warmup_recipe)")  # fmt: skip
        elif f["signal/reward_spread"] == 0:
            fixes.append("the task is too easy for this model, or the reward ignores the response")
        else:
            fixes.append("raise grpo.num_generations_per_prompt or policy.generation.temperature, or give the "
                         "reward partial credit")  # fmt: skip
        message = (
            (
                f"no learning signal in step 1: every sample scored {rewards[0]:.4g}"
                if f["signal/reward_spread"] == 0
                else "no learning signal in step 1: each prompt's samples all scored alike"
            )
            + f"{self._example()}; "
            + "; ".join(fixes)
        )
        if mode == "stop":
            raise InputError(f"{message} (health.preflight: warn to go on anyway)")
        self.warn(f"{message} (health.preflight: stop ends such a run here)")

    def _example(self) -> str:
        if self.sample is None:
            return ""
        turns = self.sample.get("turns") or [{}]
        text = str(turns[-1].get("text", ""))
        return f" (one response: {text[-80:]!r})"
