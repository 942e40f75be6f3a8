"""Agent programs for the agent-environment tests, loaded by ``environment.entry`` (``scripted_agents:NAME``)."""

import asyncio
import sys
import time

from rl_agents.calculator_agent import run as calculator  # noqa: F401 - an entry of these tests
from rl_core.rewards.environments import Calculator


async def scripted(row, client):
    """The scripted calculator of tests/rl_rollout_hf/test_episodes.py as an agent: a turn that would end the
    episode gets " Try again:" instead, so every episode takes all its turns (the run refuses the one past them)."""
    text = str(row["prompt"])
    while True:
        out = await client.completions.create(model="policy", prompt=text, stop=["</calc>", "</answer>"])
        action = out.choices[0].text
        answer = Calculator().step(int(row["answer"]), action)
        text += action + (answer.observation if not answer.done else " Try again:")


async def editing(row, client):
    """Two requests, the second with the first's answer rewritten: the episode splits in two samples."""
    first = await client.completions.create(model="policy", prompt=row["prompt"], max_tokens=4)
    edited = row["prompt"] + " (an edited history)" + first.choices[0].text[::-1]
    await client.completions.create(model="policy", prompt=edited, max_tokens=4)
    return 0.5


async def chatty(row, client):
    """A chat: the model's reply, then a user turn, through the chat template."""
    messages = [{"role": "user", "content": row["prompt"]}]
    first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "ok?"}]
    await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    return 1.0


async def faulty(row, client):
    """By row: raise, hang, ask past the turn limit, or answer once."""
    kind = row["kind"]
    if kind == "raises":
        await client.completions.create(model="policy", prompt=row["prompt"], max_tokens=2)
        raise ValueError("the agent crashed")
    if kind == "hangs":
        await asyncio.sleep(60)
    if kind == "talks":
        while True:
            await client.completions.create(model="policy", prompt=row["prompt"], max_tokens=2)
    await client.completions.create(model="policy", prompt=row["prompt"], max_tokens=2)
    return 1.0


def blocking(row, client):
    """A plain function with the blocking client; one row sleeps past the time limit in its thread."""
    if row["kind"] == "hangs":
        time.sleep(5)
    client.completions.create(model="policy", prompt=row["prompt"], max_tokens=2)
    return 1.0


#: what ``streamed`` read from each stream, by prompt
STREAMED: dict[str, str] = {}


async def streamed(row, client):
    """A completion and a chat reply read as server-sent events."""
    stream = await client.completions.create(model="policy", prompt=row["prompt"], max_tokens=4, stream=True)
    text = "".join([chunk.choices[0].text async for chunk in stream])
    chat = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["prompt"] + text}], max_tokens=4, stream=True
    )
    STREAMED[row["prompt"]] = text + "|" + "".join([c.choices[0].delta.content or "" async for c in chat])
    return 1.0


async def escaping(row, client):
    """By row: leave with ``SystemExit`` or ``KeyboardInterrupt``, block its event loop, wait on a child process
    that hangs, or answer once."""
    kind = row["kind"]
    if kind == "exits":
        sys.exit(3)
    if kind == "interrupts":
        raise KeyboardInterrupt
    if kind == "blocks":
        time.sleep(30)
    if kind == "child":
        child = await asyncio.create_subprocess_exec(
            "sleep", "30", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        await child.wait()
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return 1.0


#: what ``asks`` got for each request of its table: (status, body)
ANSWERS: dict[str, tuple[int, dict]] = {}


def asks(row, client):
    """Each request of ``row["table"]`` (name: (path, body)) sent over HTTP as is, its answer kept in ``ANSWERS``."""
    import httpx

    for name, (path, body) in row["table"].items():
        url = str(client.base_url).rstrip("/") + path
        reply = httpx.post(url, json=body, headers={"x-api-key": client.api_key}, timeout=60)
        ANSWERS[name] = (reply.status_code, reply.json())
    return 1.0
