"""The core's calculator task written with the OpenAI Agents SDK, as its docs write an agent: a ``calculator``
function tool, the model over the run's client, ``Runner.run``; reward 1 when the final answer is the sum
(``environment: {name: agent, entry: "rl_agents.calculator_sdk_agent:run"}``; needs ``openai-agents``, in
rl-agents' ``test`` extra). ``warmup_rows`` are its format warm-up: transcripts rendered as the endpoint renders the
SDK's requests (the built-in ``chatml-tools`` template), that call the tool 40% of the time and guess otherwise."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from rl_agents.calculator_agent import evaluate

INSTRUCTIONS = "Add with the calculator."


def calculator(expression: str) -> str:
    """Add."""
    return str(evaluate(expression))


async def run(row: Mapping[str, Any], client: Any) -> float:
    """One episode: the SDK's run of the agent; a malformed call or a run past two model turns scores 0."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.exceptions import AgentsException

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = Agent(name="calculator", instructions=INSTRUCTIONS, model=model, tools=[function_tool(calculator)])
    try:
        result = await Runner.run(agent, str(row["prompt"]), max_turns=2)
    except AgentsException:
        return 0.0
    return float(str(result.final_output).strip() == str(row["answer"]))


def warmup_rows(tokenizer: Any, rows: list[Mapping[str, Any]], seed: int) -> list[dict[str, str]]:
    """SFT rows (``prompt``, ``response``) for ``rows`` of the calculator task, rendered by ``chatml-tools`` with the
    tool as the SDK sends it."""
    from agents import function_tool

    from rl_agents.templates import CHATML_TOOLS

    tool = function_tool(calculator)
    tools = [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                               "parameters": tool.params_json_schema}}]  # fmt: skip
    rng = random.Random(seed)

    def render(messages: list[dict[str, Any]], generation: bool) -> str:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=CHATML_TOOLS, add_generation_prompt=generation, tokenize=False
        )
        return str(text)

    out = []
    for row in rows:
        asked = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": str(row["prompt"])}]
        prompt = render(asked, True)
        expression = str(row["prompt"]).removeprefix("Add ").removesuffix(".")
        if rng.random() < 0.4:
            call = {
                "id": "c",
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": expression}},
            }
            turns = [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c", "content": calculator(expression)},
                {"role": "assistant", "content": str(row["answer"])},
            ]
        else:
            turns = [{"role": "assistant", "content": str(rng.randint(20, 198))}]
        full = render(asked + turns, False)
        response = full[len(prompt) :].removesuffix(tokenizer.eos_token + "\n")
        out.append({"prompt": prompt, "response": response})
    return out
