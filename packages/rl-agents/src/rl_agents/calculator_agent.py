"""The core's calculator task written as an agent program against the ``openai`` client, not the environment API
(``environment: {name: agent, entry: "rl_agents.calculator_agent:run"}``). It asks for a completion of the task;
a ``<calc>47+86</calc>`` call gets `` = 133`` and a new request, an ``<answer>133</answer>`` ends the episode with
reward 1 when right; anything else ends it with 0. The run's ``environment.max_turns`` refuses requests past it.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Mapping
from typing import Any

CALL = re.compile(r"<calc>\s*(\d+(?:\s*[-+*]\s*\d+)*)\s*</calc>")
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> int:
    """An integer expression of + - * (what ``CALL`` admits), through Python's parser, not ``eval``; numbers are
    read as decimals, leading zeros and all (``047`` is 47), as the core's calculator reads them."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return int(OPERATORS[type(node.op)](value(node.left), value(node.right)))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(f"not a sum: {expression!r}")

    decimal = re.sub(r"\d+", lambda m: str(int(m.group())), expression)
    return value(ast.parse(decimal, mode="eval").body)


async def run(row: Mapping[str, Any], client: Any) -> float:
    """One episode: the model's completions of the task's text, the calculator's answers appended to it."""
    text = str(row["prompt"])
    while True:
        out = await client.completions.create(model="policy", prompt=text, stop=["</calc>", "</answer>"])
        action = out.choices[0].text
        answer = ANSWER.search(action)
        if answer is not None:
            return float(int(answer.group(1)) == int(row["answer"]))
        call = CALL.search(action)
        if call is None:
            return 0.0
        text += action + f" = {evaluate(call.group(1))}\n"
