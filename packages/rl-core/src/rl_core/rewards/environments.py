"""The core's multi-turn environments (registered by ``rl_core.plugins.builtin``), cheap enough for a CPU.

- ``calculator``: two-digit sums the model cannot do by itself, and a calculator it may call. A model turn is a
  call, ``<calc>47+86</calc>`` (the calculator evaluates the expression written, + - * on non-negative integers, and answers
  `` = 133``), or an answer, ``<answer>133</answer>``, which ends the episode with reward 1 when right, else 0. A
  turn that is neither ends it with 0.
- ``guess_number``: the model guesses a secret integer; the environment answers `` higher``, `` lower`` or ends the
  episode, with reward 1 when the guess is right (``decay``: less for later turns).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from rl_core.base.errors import InputError
from rl_core.contracts.protocols import Transition

CALL = re.compile(r"<calc>\s*(\d+(?:\s*[-+*]\s*\d+)*)\s*</calc>")
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def _field(row: Mapping[str, Any], key: str, env: str) -> Any:
    if key not in row:
        raise InputError(f"the {env} environment needs {key!r} in every data row; fields: {sorted(row)}")
    return row[key]


@attrs.frozen(kw_only=True)
class CalculatorConfig:
    #: the row field holding the question, and the one holding the right answer.
    prompt_key: str = "prompt"
    #: the data row's field holding the sum's right answer.
    answer_key: str = "answer"


@attrs.frozen(kw_only=True)
class Calculator:
    """The state is the right answer; every call is evaluated safely (integers and + - * only)."""

    cfg: CalculatorConfig = attrs.Factory(CalculatorConfig)

    def reset(self, row: Mapping[str, Any]) -> tuple[str, Any]:
        return str(_field(row, self.cfg.prompt_key, "calculator")), int(_field(row, self.cfg.answer_key, "calculator"))

    def step(self, state: Any, action: str) -> Transition:
        answer = ANSWER.search(action)
        if answer is not None:
            return Transition(observation="", reward=float(int(answer.group(1)) == state), done=True, state=state)
        call = CALL.search(action)
        if call is None:
            return Transition(observation="", reward=0.0, done=True, state=state)
        return Transition(observation=f" = {_evaluate(call.group(1))}\n", state=state)

    def close(self) -> None:
        return None


def _evaluate(expression: str) -> int:
    """``a op b op c ...`` on non-negative integers, * before + and -: no eval()."""
    tokens = re.findall(r"\d+|[-+*]", expression)
    terms: list[int] = [int(tokens[0])]
    for op, value in zip(tokens[1::2], tokens[2::2], strict=True):
        if op == "*":
            terms[-1] *= int(value)
        else:
            terms.append(int(value) if op == "+" else -int(value))
    return sum(terms)


@attrs.frozen(kw_only=True)
class GuessNumberConfig:
    #: the data row's field holding the number to guess.
    secret_key: str = "secret"
    #: the reward of a right guess at turn t (0-based) is decay ** t.
    decay: float = attrs.field(default=1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)])


@attrs.frozen(kw_only=True)
class GuessNumber:
    """The state is (secret, turn)."""

    cfg: GuessNumberConfig = attrs.Factory(GuessNumberConfig)

    def reset(self, row: Mapping[str, Any]) -> tuple[str, Any]:
        secret = int(_field(row, self.cfg.secret_key, "guess_number"))
        return str(row.get("prompt", "Guess my number from 1 to 100. Guess:")), (secret, 0)

    def step(self, state: Any, action: str) -> Transition:
        secret, turn = state
        found = re.search(r"-?\d+", action)
        if found is None:
            return Transition(observation="", done=True, state=state)
        guess = int(found.group())
        if guess == secret:
            return Transition(observation="", reward=self.cfg.decay**turn, done=True, state=state)
        hint = " higher. Guess:" if guess < secret else " lower. Guess:"
        return Transition(observation=hint, state=(secret, turn + 1))

    def close(self) -> None:
        return None
