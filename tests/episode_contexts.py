"""Shared pieces of the multi-turn episode tests (their run context is ``rl_core.testing.episodes``)."""

from typing import Any

from rl_core.contracts.protocols import Transition
from rl_core.rewards.environments import Calculator


class ScriptedCalculator(Calculator):
    """The calculator, but a model turn that is not a call still gets an observation (" Try again:"): every episode
    runs all its turns (tests/rl_agents/scripted_agents.py's ``scripted`` is this as an agent program)."""

    def step(self, state: Any, action: str) -> Transition:
        answer = super().step(state, action)
        return answer if not answer.done else Transition(observation=" Try again:", state=state)
