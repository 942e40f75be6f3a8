"""The OpenAI- and Anthropic-compatible endpoint in front of the run's rollout engine: ``/v1/completions``,
``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages`` and ``/v1/models``, each request attributed to its
episode by its base URL (``/ep/KEY/v1``, what an episode's client is given) or its API key (``Authorization: Bearer``
or ``x-api-key``). A base URL of its own per episode also keeps apart what a library caches per URL (LangChain's
HTTP client, bound to the event loop of the episode that made it).

A chat request of any of the three APIs is read into chat messages (``requests.py``), rendered by the chosen
template (``templates.py``) with every assistant message the endpoint made kept as the exact ids it sampled
(``AgentEpisode.chat_ids``), sampled, and its completion read for tool calls (``toolcalls.py``). Sampling follows
the run (``policy.generation``, each request's seed from its episode and turn); a request may set its token limit
(up to ``environment.max_tokens_per_turn``), stop strings and, in a chat, ``n``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.completion_choice import Logprobs

from rl_agents import chat_api, messages_api, responses_api
from rl_agents.answers import Answer, answer, token_texts
from rl_agents.dispatch import Dispatcher
from rl_agents.episode import AgentEpisode, Refused
from rl_agents.requests import Asked, BadRequest, check_fields, positive, stops
from rl_agents.templates import Templates
from rl_agents.toolcalls import Parsed, ToolParser
from rl_core.api import Call, EnvironmentConfig, SamplingParams, turn_seed

log = logging.getLogger(__name__)

COMPLETION_FIELDS = ("model", "prompt", "max_tokens", "stop", "n", "stream", "stream_options", "logprobs", "echo")


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
    templates: Templates
    #: ``environment.tool_parser``
    tool_parser: str
    parsers: dict[str, ToolParser] = attrs.Factory(dict)
    #: completions that looked like a tool call but did not parse, this batch
    parse_errors: int = 0

    def sampling(
        self, episode: AgentEpisode, asked_tokens: int | None, stop: tuple[str, ...], n: int
    ) -> SamplingParams:
        base = self.params
        max_new = self.env.max_tokens_per_turn or base.max_new_tokens
        return attrs.evolve(
            base,
            n=n,
            max_new_tokens=min(max_new, asked_tokens) if asked_tokens else max_new,
            stop_strings=tuple(base.stop_strings) + stop,
            seed=turn_seed(base.seed, episode.requests, episode.number if self.streaming else None),
        )

    def render(self, asked: Asked) -> tuple[Callable[[list[dict[str, Any]]], str], ToolParser]:
        """How to render ``asked``'s messages, and how to read tool calls in what the model writes after them."""
        template = self.templates.pick(bool(asked.tools))
        if template not in self.parsers:
            self.parsers[template] = ToolParser(self.tool_parser, self.tokenizer, template)

        def render(messages: list[dict[str, Any]]) -> str:
            try:
                text = self.tokenizer.apply_chat_template(
                    messages, tools=asked.tools, chat_template=template, add_generation_prompt=True, tokenize=False
                )
            except Exception as exc:  # jinja's own errors: the request's, named
                raise BadRequest(
                    f"the chat template cannot render these messages: {type(exc).__name__}: {exc}"
                ) from exc
            return str(text)

        return render, self.parsers[template]


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": kind}}, status_code=status)


def _sse(items: Iterator[dict[str, Any]], named: bool, done: bool) -> StreamingResponse:
    """Server-sent events: each item a ``data:`` line (``event:`` its type first, for the Anthropic and Responses
    streams), then ``[DONE]`` for OpenAI's chat and completions."""

    def lines() -> Iterator[str]:
        for item in items:
            head = f"event: {item['type']}\n" if named else ""
            yield f"{head}data: {json.dumps(item)}\n\n"
        if done:
            yield "data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream")


class Endpoint:
    """The FastAPI app, serving every batch of episodes under way (a training batch and a validation may run at
    once: async GRPO generates ahead while the trainer validates); a key names its episode and so its batch."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        #: each live episode's key: its batch and itself
        self.live: dict[str, tuple[Session, AgentEpisode]] = {}
        self.app = FastAPI(title="rl-agents endpoint")
        for base in ("/v1", "/ep/{key}/v1"):
            self.app.get(f"{base}/models")(self.models)
            self.app.post(f"{base}/completions")(self.completions)
            self.app.post(f"{base}/chat/completions")(self.chat_completions)
            self.app.post(f"{base}/responses")(self.responses)
            self.app.post(f"{base}/messages")(self.messages)

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "rl"}]}

    async def completions(self, request: Request) -> Any:
        return await self._serve(request, "completions")

    async def chat_completions(self, request: Request) -> Any:
        return await self._serve(request, "chat")

    async def responses(self, request: Request) -> Any:
        return await self._serve(request, "responses")

    async def messages(self, request: Request) -> Any:
        return await self._serve(request, "messages")

    async def _serve(self, request: Request, api: str) -> Any:
        key = (
            request.path_params.get("key")
            or request.headers.get("x-api-key")
            or request.headers.get("authorization", "").removeprefix("Bearer ")
        ).strip()
        if key not in self.live:
            return _error(401, "unknown API key: each episode has its own (the client the agent was given)", "auth")
        session, episode = self.live[key]
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the request body is a JSON object")
            if api == "completions":
                return await self._complete(session, episode, body)
            asked = {"chat": chat_api.read, "responses": responses_api.read, "messages": messages_api.read}[api](body)
            render, parser = session.render(asked)
            ids, text = episode.chat_ids(asked.messages, render, session.tokenizer)
            params = session.sampling(episode, asked.max_tokens, asked.stop, asked.n)
            answers = await self._sample(
                session, episode, (ids, text), params, parser if asked.tools else None, asked.logprobs
            )
        except (BadRequest, ValueError, TypeError, KeyError) as exc:
            return _error(400, f"bad request: {exc}", "invalid_request_error")
        except Refused as refused:
            return _error(400, str(refused), refused.reason)
        usage = (len(ids), sum(len(a.call.token_ids) for a in answers))
        if api == "chat":
            done = chat_api.reply(self.model_name, answers, usage, asked.logprobs)
            if asked.stream:
                return _sse(chat_api.events(done, asked.include_usage), named=False, done=True)
            return done.model_dump(exclude_none=True)
        if api == "responses":
            out = responses_api.reply(self.model_name, answers[0], usage, body)
            return _sse(responses_api.events(out), named=True, done=False) if asked.stream else out
        out = messages_api.reply(self.model_name, answers[0], usage, asked.stop)
        return _sse(messages_api.events(out), named=True, done=False) if asked.stream else out

    async def _sample(
        self,
        session: Session,
        episode: AgentEpisode,
        prompt: tuple[list[int], str],
        params: SamplingParams,
        parser: ToolParser | None,
        logprobs: bool,
    ) -> list[Answer]:
        """Sample ``params.n`` completions of ``prompt`` (its ids and rendered text) for the episode, each recorded
        and, with tools offered, read for tool calls."""
        tok = session.tokenizer
        ids, text = prompt
        calls = await self._calls(session, episode, ids, text, params)
        answers = []
        for call in calls:
            parsed = Parsed(tok.decode(list(call.token_ids), skip_special_tokens=True))
            if parser is not None:
                read = parser.parse(_without_end(tok.decode(list(call.token_ids), skip_special_tokens=False), tok))
                session.parse_errors += read.failed
                parsed = read if read.calls else parsed
            episode.answered(call, text, parsed.content, [c.id for c in parsed.calls])
            answers.append(answer(parsed, call, tok, logprobs))
        return answers

    async def _calls(
        self, session: Session, episode: AgentEpisode, ids: list[int], text: str, params: SamplingParams
    ) -> list[Call]:
        """Admit the request, sample it, and record its calls (cut at the episode's budget)."""
        try:
            episode.admit(ids, session.env, session.context)
        except Refused as refused:
            episode.ended = refused.reason
            session.dispatcher.poke()
            raise
        episode.requests += 1
        outs = await session.dispatcher.sample(episode, ids, params)
        if episode.ended is not None:  # it timed out (or failed) while it waited
            raise Refused(episode.ended, f"this episode has ended ({episode.ended})")
        version = session.version()
        return [
            episode.record(
                Call(
                    prompt_ids=tuple(ids),
                    token_ids=out.token_ids,
                    logprobs=out.logprobs,
                    finish_reason=out.finish_reason,
                    version=version,
                ),
                session.env,
                session.tokenizer,
                text,
            )
            for out in outs
        ]

    async def _complete(self, session: Session, episode: AgentEpisode, body: dict[str, Any]) -> Any:
        """``/v1/completions``: a text prompt (or token ids), continued; the text keeps earlier sampled ids."""
        check_fields(body, COMPLETION_FIELDS, "completions")
        if body.get("echo"):
            raise BadRequest("echo: the prompt is not sent back; leave it unset")
        if body.get("logprobs"):
            raise BadRequest("logprobs: only 0 (the sampled tokens' logprobs) is served")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids, text = list(prompt), session.tokenizer.decode(prompt)
        elif isinstance(prompt, str) and prompt:
            ids, text = episode.ids(prompt, session.tokenizer), prompt
        else:
            raise BadRequest("prompt must be one non-empty string or one list of token ids")
        params = session.sampling(episode, positive(body, "max_tokens", None), stops(body.get("stop")),
                                  positive(body, "n", 1) or 1)  # fmt: skip
        calls = await self._calls(session, episode, ids, text, params)
        tok = session.tokenizer
        texts = [tok.decode(list(c.token_ids), skip_special_tokens=True) for c in calls]
        with_logprobs = body.get("logprobs") == 0 and body.get("logprobs") is not False
        reply = Completion(
            id=f"cmpl-{uuid.uuid4().hex}",
            object="text_completion",
            created=int(time.time()),
            model=self.model_name,
            choices=[
                CompletionChoice(
                    index=i,
                    text=t,
                    finish_reason=c.finish_reason,
                    logprobs=Logprobs(tokens=token_texts(tok, c.token_ids), token_logprobs=list(c.logprobs))
                    if with_logprobs
                    else None,
                )
                for i, (t, c) in enumerate(zip(texts, calls, strict=True))
            ],
            usage=CompletionUsage(
                prompt_tokens=len(ids),
                completion_tokens=sum(len(c.token_ids) for c in calls),
                total_tokens=len(ids) + sum(len(c.token_ids) for c in calls),
            ),
        )
        if body.get("stream"):
            chunks = [reply.model_copy(update={"choices": [c], "usage": None}) for c in reply.choices]
            if (body.get("stream_options") or {}).get("include_usage"):
                chunks.append(reply.model_copy(update={"choices": []}))
            return _sse((c.model_dump(exclude_none=True) for c in chunks), named=False, done=True)
        return reply.model_dump(exclude_none=True)


def _without_end(text: str, tokenizer: Any) -> str:
    """A completion's text without the end-of-text token it may close with."""
    eos = tokenizer.eos_token or ""
    return text[: -len(eos)] if eos and text.endswith(eos) else text
