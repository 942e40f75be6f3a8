"""Agent programs written as the agent libraries' own docs write them, unmodified: each is asked to add two numbers
with a ``calculator`` function tool, and scores 1.0 when its final answer holds the sum. Loaded by
``environment.entry`` (``library_agents:NAME``)."""

import json

from rl_agents.calculator_agent import evaluate

PROMPT = "Add the two numbers with the calculator."
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}


def calculator(expression: str) -> str:
    """Evaluate an integer expression of + - and *."""
    return str(evaluate(expression))


def score(text, row) -> float:
    return float(str(row["answer"]) in (text or ""))


async def chat_tools(row, client):
    """The ``openai`` client's tools loop, as OpenAI's function-calling guide writes it."""
    tools = [{"type": "function", "function": {"name": "calculator", "description": PROMPT, "parameters": SCHEMA}}]
    messages = [{"role": "user", "content": row["prompt"]}]
    while True:
        out = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
        message = out.choices[0].message
        if not message.tool_calls:
            return score(message.content, row)
        messages.append(message)
        for call in message.tool_calls:
            result = calculator(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


async def chat_tools_streamed(row, client):
    """The same loop over a streamed reply, the tool call assembled from its deltas."""
    tools = [{"type": "function", "function": {"name": "calculator", "description": PROMPT, "parameters": SCHEMA}}]
    messages = [{"role": "user", "content": row["prompt"]}]
    while True:
        stream = await client.chat.completions.create(
            model="policy", messages=messages, tools=tools, stream=True, stream_options={"include_usage": True}
        )
        text, calls, usage = "", {}, None
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for d in choice.delta.tool_calls or []:
                    call = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                    call["name"] += d.function.name or ""
                    call["arguments"] += d.function.arguments or ""
        assert usage is not None and usage.completion_tokens > 0, "the usage chunk came"
        if not calls:
            return score(text, row)
        messages.append(
            {
                "role": "assistant",
                "content": text or None,
                "tool_calls": [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls.values()
                ],
            }
        )
        for c in calls.values():
            messages.append(
                {"role": "tool", "tool_call_id": c["id"], "content": calculator(**json.loads(c["arguments"]))}
            )


async def responses_tools(row, client):
    """The Responses API's function-calling loop: the output items appended to the input, then the results."""
    tools = [{"type": "function", "name": "calculator", "description": PROMPT, "parameters": SCHEMA}]
    items = [{"role": "user", "content": row["prompt"]}]
    while True:
        out = await client.responses.create(model="policy", input=items, tools=tools)
        calls = [item for item in out.output if item.type == "function_call"]
        if not calls:
            return score(out.output_text, row)
        items += out.output
        for call in calls:
            result = calculator(**json.loads(call.arguments))
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": result})


async def agents_sdk(row, client):
    """The OpenAI Agents SDK over the Chat Completions API."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = Agent(name="adder", instructions=PROMPT, model=model, tools=[function_tool(calculator)])
    return score((await Runner.run(agent, row["prompt"])).final_output, row)


async def agents_sdk_responses(row, client):
    """The OpenAI Agents SDK over the Responses API."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="policy", openai_client=client)
    agent = Agent(name="adder", instructions=PROMPT, model=model, tools=[function_tool(calculator)])
    return score((await Runner.run(agent, row["prompt"])).final_output, row)


async def langgraph(row, client):
    """LangGraph's prebuilt ReAct agent over LangChain's ChatOpenAI."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    llm = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    graph = create_react_agent(llm, tools=[tool(calculator)])
    out = await graph.ainvoke({"messages": [("user", row["prompt"])]})
    return score(out["messages"][-1].content, row)


async def pydantic_ai(row, client):
    """A pydantic-ai agent with a plain function as its tool."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    agent = Agent(OpenAIChatModel("policy", provider=OpenAIProvider(openai_client=client)), tools=[calculator])
    return score((await agent.run(row["prompt"])).output, row)


async def anthropic_messages(row, client):
    """The ``anthropic`` client's tool-use loop over the Messages API."""
    from anthropic import AsyncAnthropic

    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    claude = AsyncAnthropic(base_url=base, api_key=client.api_key, max_retries=0)
    tools = [{"name": "calculator", "description": PROMPT, "input_schema": SCHEMA}]
    messages = [{"role": "user", "content": row["prompt"]}]
    try:
        while True:
            out = await claude.messages.create(model="policy", max_tokens=256, messages=messages, tools=tools)
            if out.stop_reason != "tool_use":
                return score("".join(b.text for b in out.content if b.type == "text"), row)
            messages.append({"role": "assistant", "content": out.content})
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": calculator(**b.input)}
                for b in out.content
                if b.type == "tool_use"
            ]
            messages.append({"role": "user", "content": results})
    finally:
        await claude.close()
