"""The OpenAI-compatible endpoint in front of the run's rollout engine: ``/v1/completions``,
``/v1/chat/completions`` and ``/v1/models``, each request attributed to its episode by the API key.

The endpoint renders a chat's template itself (``tools`` passed to it, unless ``tool_choice`` is ``none``) and
turns every prompt into token ids with ``AgentEpisode.ids``: what the model sampled earlier in the episode keeps
its exact ids. Sampling follows the run (``policy.generation``: temperature, top-p, top-k and the seed of each
request, so that runs are reproducible); a request may set ``max_tokens`` (up to
``environment.max_tokens_per_turn``), ``stop`` and ``n``. Completions are returned as sampled, stop string
included (vLLM's ``include_stop_str_in_output``), special tokens left out; ``stream: true`` is answered with one
chunk per choice.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from rl_agents.dispatch import Dispatcher
from rl_agents.episode import AgentEpisode, Refused
from rl_core.api import Call, EnvironmentConfig, SamplingParams, turn_seed


@attrs.define(eq=False)
class Session:
    """One batch of episodes being served (a step's rollouts or a validation)."""

    tokenizer: Any
    env: EnvironmentConfig
    #: the model's context (``policy.max_total_sequence_length``)
    context: int
    #: the run's sampling for this batch (its seed the batch's)
    params: SamplingParams
    dispatcher: Dispatcher
    #: seeds per (turn, episode) when requests stream, per turn in lockstep
    streaming: bool
    #: refits of the engine so far: the policy version of a call
    version: Callable[[], int]

    def sampling(self, episode: AgentEpisode, body: dict[str, Any]) -> SamplingParams:
        base = self.params
        max_new = self.env.max_tokens_per_turn or base.max_new_tokens
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        stop = body.get("stop") or []
        return attrs.evolve(
            base,
            n=_int(body, "n", 1),
            max_new_tokens=min(max_new, int(asked)) if asked else max_new,
            stop_strings=tuple(base.stop_strings) + tuple([stop] if isinstance(stop, str) else stop),
            seed=turn_seed(base.seed, episode.requests, episode.number if self.streaming else None),
        )


class BadRequest(Exception):
    pass


def _int(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or value < 1:
        raise BadRequest(f"{key} must be a positive integer, not {value!r}")
    return value


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": kind}}, status_code=status)


class Endpoint:
    """The FastAPI app, serving every batch of episodes under way (a training batch and a validation may run at
    once: async GRPO generates ahead while the trainer validates); a key names its episode and so its batch."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        #: each live episode's key: its batch and itself
        self.live: dict[str, tuple[Session, AgentEpisode]] = {}
        self.app = FastAPI(title="rl-agents endpoint")
        self.app.get("/v1/models")(self.models)
        self.app.post("/v1/completions")(self.completions)
        self.app.post("/v1/chat/completions")(self.chat_completions)

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "rl"}]}

    async def completions(self, request: Request) -> Any:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request) -> Any:
        return await self._serve(request, chat=True)

    async def _serve(self, request: Request, *, chat: bool) -> Any:
        key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if key not in self.live:
            return _error(401, "unknown API key: each episode has its own (the client the agent was given)", "auth")
        session, episode = self.live[key]
        try:
            body = await request.json()
            ids, text = self._prompt(session, episode, body, chat)
            params = session.sampling(episode, body)
        except (BadRequest, ValueError, TypeError, KeyError) as exc:
            return _error(400, f"bad request: {exc}", "invalid_request_error")
        try:
            episode.admit(ids, session.env, session.context)
        except Refused as refused:
            episode.ended = refused.reason
            session.dispatcher.poke()
            return _error(400, str(refused), refused.reason)
        episode.requests += 1
        outs = await session.dispatcher.sample(episode, ids, params)
        if episode.ended is not None:  # it timed out (or failed) while it waited
            return _error(400, f"this episode has ended ({episode.ended})", "ended")
        calls = [
            episode.record(
                Call(
                    prompt_ids=tuple(ids),
                    token_ids=out.token_ids,
                    logprobs=out.logprobs,
                    finish_reason=out.finish_reason,
                    version=session.version(),
                ),
                session.env,
                session.tokenizer,
                text,
            )
            for out in outs
        ]
        texts = [session.tokenizer.decode(list(c.token_ids), skip_special_tokens=True) for c in calls]
        usage = CompletionUsage(
            prompt_tokens=len(ids),
            completion_tokens=sum(len(c.token_ids) for c in calls),
            total_tokens=len(ids) + sum(len(c.token_ids) for c in calls),
        )
        reply = _chat_reply if chat else _completion_reply
        if body.get("stream"):
            return StreamingResponse(
                _events(reply(self.model_name, texts, calls, usage), chat), media_type="text/event-stream"
            )
        return reply(self.model_name, texts, calls, usage).model_dump(exclude_none=True)

    def _prompt(
        self, session: Session, episode: AgentEpisode, body: dict[str, Any], chat: bool
    ) -> tuple[list[int], str]:
        """The request's prompt as token ids, and as the text the agent sent (a chat: its rendered template)."""
        tok = session.tokenizer
        if chat:
            messages = body["messages"]
            tools = body.get("tools") if body.get("tool_choice") != "none" else None
            if not getattr(tok, "chat_template", None):
                raise BadRequest("the model's tokenizer has no chat template: use /v1/completions")
            text = str(tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False))
            return episode.ids(text, tok), text
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt), tok.decode(prompt)
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt must be one non-empty string or one list of token ids")
        return episode.ids(prompt, tok), prompt


def _completion_reply(model: str, texts: list[str], calls: list[Call], usage: CompletionUsage) -> Completion:
    return Completion(
        id=f"cmpl-{uuid.uuid4().hex}",
        object="text_completion",
        created=int(time.time()),
        model=model,
        choices=[
            CompletionChoice(index=i, text=text, finish_reason=call.finish_reason)
            for i, (text, call) in enumerate(zip(texts, calls, strict=True))
        ],
        usage=usage,
    )


def _chat_reply(model: str, texts: list[str], calls: list[Call], usage: CompletionUsage) -> ChatCompletion:
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=[
            ChatChoice(
                index=i,
                message=ChatCompletionMessage(role="assistant", content=text),
                finish_reason=call.finish_reason,
            )
            for i, (text, call) in enumerate(zip(texts, calls, strict=True))
        ],
        usage=usage,
    )


async def _events(reply: Completion | ChatCompletion, chat: bool) -> AsyncIterator[str]:
    """Server-sent events: one chunk per choice (its whole text and finish reason), then ``[DONE]``."""
    for choice in reply.choices:
        if chat:
            assert isinstance(choice, ChatChoice)
            chunk: Any = ChatCompletionChunk(
                id=reply.id,
                object="chat.completion.chunk",
                created=reply.created,
                model=reply.model,
                choices=[
                    ChunkChoice(
                        index=choice.index,
                        delta=ChoiceDelta(role="assistant", content=choice.message.content),
                        finish_reason=choice.finish_reason,
                    )
                ],
            )
        else:
            chunk = reply.model_copy(update={"choices": [choice]})
        yield f"data: {json.dumps(chunk.model_dump(exclude_none=True))}\n\n"
    yield "data: [DONE]\n\n"
