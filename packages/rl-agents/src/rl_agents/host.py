"""The ``agent`` environment: the run's episodes are calls of the user's agent function, each with a client bound to
its own key on the endpoint; their samples are built from what the endpoint recorded
(``rl_core.api.episode_rollouts``), never from the agent's text. An agent that raises or overruns
``time_limit_s`` ends its own episode (the reason in ``env/ended_*`` and one log line), never the run.

The endpoint runs on an event loop in a thread of the driver, started with the first batch; each agent runs in a
thread of its own (``contained.py``), so that no agent can stop the endpoint or another episode."""

from __future__ import annotations

import asyncio
import importlib
import logging
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl_agents.config import AgentConfig
from rl_agents.contained import Contained
from rl_agents.dispatch import Lockstep, Streaming
from rl_agents.endpoint import Endpoint, Session
from rl_agents.episode import AgentEpisode
from rl_agents.templates import Templates
from rl_core.api import ConfigError, DrivenEpisodes, Rollout, SamplingParams, episode_rollouts, free_port, render_prompt

log = logging.getLogger(__name__)


def load_entry(entry: str) -> Callable[..., Any]:
    """The agent function ``module:function`` names; a ``ConfigError`` naming ``environment.entry`` otherwise."""
    module, _, name = entry.partition(":")
    if not module or not name:
        raise ConfigError(f"environment.entry: {entry!r} is not 'module:function' (for example 'my_pkg.agent:run')")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"environment.entry: cannot load {entry!r}: {exc}") from exc
    if not callable(fn):
        raise ConfigError(f"environment.entry: {entry!r} is not a function")
    return fn


class AgentHost:
    """An ``EpisodeDriver``: serves the endpoint and runs ``params.n`` agent episodes per example."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.agent = load_entry(cfg.entry)
        self.endpoint: Endpoint | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: Any = None
        self.url = ""
        #: one connection pool for the plain functions' clients; an async agent's client has its own (its own event
        #: loop), over one SSL context (each would cost ~20 ms to make its own)
        self.http_sync: Any = None
        self.ssl = ssl.create_default_context()
        self.templates: Templates | None = None
        self.starting = threading.Lock()

    def start(self, model_name: str) -> str:
        """Serve the endpoint (once, whichever thread asks first); its base URL."""
        with self.starting:
            if self.endpoint is None:
                self._serve(model_name)
        return self.url

    def _serve(self, model_name: str) -> None:
        import openai
        import uvicorn

        self.http_sync = openai.DefaultHttpxClient(verify=self.ssl)

        self.endpoint = Endpoint(model_name)
        port = self.cfg.port or free_port()
        config = uvicorn.Config(self.endpoint.app, host=self.cfg.host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="agent-endpoint", daemon=True).start()
        asyncio.run_coroutine_threadsafe(self.server.serve(), self.loop)
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agent endpoint did not start on {self.cfg.host}:{port}")
            time.sleep(0.02)
        connect = "127.0.0.1" if self.cfg.host in ("0.0.0.0", "::") else self.cfg.host
        self.url = f"http://{connect}:{port}/v1"
        log.info("agent endpoint on %s", self.url)

    def run(self, host: Any, examples: Sequence[Mapping[str, Any]], params: SamplingParams) -> DrivenEpisodes:
        self.start(str(host.config.policy.model_name))
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(self._batch(host, examples, params), self.loop).result()

    async def _batch(self, host: Any, examples: Sequence[Mapping[str, Any]], params: SamplingParams) -> DrivenEpisodes:
        assert self.endpoint is not None
        env, token = host.config.environment, secrets.token_hex(8)
        episodes = [
            AgentEpisode(
                number=i * params.n + j,
                key=f"ep-{token}-{i * params.n + j}",
                prompt_index=i,
                sample_index=j,
                row=dict(example),
            )
            for i, example in enumerate(examples)
            for j in range(params.n)
        ]
        streaming = env.schedule == "streaming" or (
            env.schedule == "auto" and bool(getattr(host.engine, "concurrent_requests", False))
        )
        if self.templates is None:
            self.templates = Templates(self.cfg.chat_template, host.tokenizer)
        session = Session(
            tokenizer=host.tokenizer,
            env=env,
            context=host.config.policy.max_total_sequence_length,
            params=params,
            dispatcher=(Streaming if streaming else Lockstep)(host.engine, episodes),
            streaming=streaming,
            version=lambda: int(getattr(host, "refits", 0)),
            templates=self.templates,
            tool_parser=self.cfg.tool_parser,
        )
        self.endpoint.live.update((e.key, (session, e)) for e in episodes)
        try:
            rewards = await asyncio.gather(*(self._episode(e, session) for e in episodes))
        finally:
            for e in episodes:
                del self.endpoint.live[e.key]
        return self._results(host, episodes, rewards, session.parse_errors)

    async def _episode(self, episode: AgentEpisode, session: Session) -> float:
        """Run the agent on one episode within its time limit; its reward (0 when it failed or returned none)."""
        import openai

        limit = self.cfg.time_limit_s
        base = self.url.removesuffix("/v1") + f"/ep/{episode.key}/v1"
        common: dict[str, Any] = {"base_url": base, "api_key": episode.key, "max_retries": 0, "timeout": None}
        agent = Contained(
            self.agent,
            episode.row,
            (
                lambda: openai.AsyncOpenAI(**common, http_client=openai.DefaultAsyncHttpxClient(verify=self.ssl)),
                lambda: openai.OpenAI(**common, http_client=self.http_sync),
            ),
            name=f"agent-{episode.number}",
        )
        value: Any = None
        try:
            value = await _within(asyncio.wrap_future(agent.done), episode, limit)
            episode.ended = episode.ended or "done"
        except TimeoutError:
            agent.cancel()
            episode.ended = episode.ended or "timeout"
        except Exception as exc:  # the agent's own failure (or a refused request after a limit): its episode's end
            episode.ended = episode.ended or f"error: {type(exc).__name__}: {exc}"
        finally:
            session.dispatcher.poke()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return 0.0
        return float(value) if not episode.ended.startswith(("timeout", "error")) else 0.0

    def _results(
        self, host: Any, episodes: Sequence[AgentEpisode], rewards: Sequence[float], parse_errors: int
    ) -> DrivenEpisodes:
        tok, cfg = host.tokenizer, host.config
        rollouts: list[Rollout] = []
        earlier: list[tuple[int, Rollout]] = []
        for index, e in enumerate(episodes):
            samples = episode_rollouts(e.calls, e.prompt_index, e.sample_index, tok)
            if not samples:  # no request at all: an empty response to the row's prompt, trained as nothing
                ids = render_prompt(tok, cfg.data, str(e.row.get(cfg.data.prompt_key, "")))[0] or [tok.eos_token_id]
                samples = [
                    Rollout(
                        prompt_index=e.prompt_index,
                        sample_index=e.sample_index,
                        prompt_token_ids=tuple(ids),
                        token_ids=(),
                        text="",
                        logprobs=(),
                        finish_reason="stop",
                        sampled=(),
                    )
                ]
            rollouts.append(samples[-1])
            earlier += [(index, s) for s in samples[:-1]]
        failed = [e for e in episodes if e.ended and e.ended.startswith(("timeout", "error"))]
        _report(failed, self.cfg.time_limit_s)
        ends = [(e.ended or "done").split(":")[0] for e in episodes]
        metrics = {
            "env/turns": sum(e.requests for e in episodes) / len(episodes),
            **{f"env/ended_{k}": ends.count(k) / len(ends) for k in sorted(set(ends))},
            "agent/samples_per_episode": (len(rollouts) + len(earlier)) / len(episodes),
            "agent/split_episodes": len({i for i, _ in earlier}) / len(episodes),
            "agent/tool_parse_errors": parse_errors / len(episodes),
        }
        keep = None
        if self.cfg.on_error == "drop" and failed:
            keep = [e not in failed for e in episodes]
        return DrivenEpisodes(
            rollouts=rollouts,
            rewards=list(rewards),
            metrics=metrics,
            transcripts=[e.transcript(tok, r) for e, r in zip(episodes, rewards, strict=True)],
            earlier=earlier,
            keep=keep,
        )

    def close(self) -> None:
        if self.server is not None and self.loop is not None:
            self.http_sync.close()
            self.server.should_exit = True
            time.sleep(0.2)
            self.loop.call_soon_threadsafe(self.loop.stop)


async def _within(work: asyncio.Future[Any], episode: AgentEpisode, limit: float) -> Any:
    """``work``'s result once it finishes within ``limit`` seconds of the agent's own time (its waits for the
    engine not counted); ``TimeoutError`` (and ``work`` cancelled) past it."""
    start = time.monotonic()
    while True:
        done, _ = await asyncio.wait({work}, timeout=max(limit - episode.own_seconds(start), 0.0))
        if done:
            return work.result()
        if episode.own_seconds(start) >= limit:
            work.cancel()
            raise TimeoutError


def _report(failed: Sequence[AgentEpisode], limit: float) -> None:
    """One line for a batch's episodes whose agent raised or overran, naming the first."""
    if not failed:
        return
    timeouts = sum(e.ended == "timeout" for e in failed)
    first = failed[0]
    log.warning(
        "agent: %d episode(s) overran environment.time_limit_s (%g s), %d raised; first: row %r, after %d "
        "request(s): %s",
        timeouts,
        limit,
        len(failed) - timeouts,
        str(first.row)[:80],
        first.requests,
        first.ended,
    )
