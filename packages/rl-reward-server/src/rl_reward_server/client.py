"""The client reward source: scores through one or more reward servers over HTTP.

Each ``score`` call splits its samples into chunks of ``batch_size`` and sends them with at most
``max_in_flight`` requests under way (so the cost is linear in the number of chunks), spread round-robin over the
servers, and retries a chunk (with ``stamina``: exponential backoff with jitter, at most ``max_retries`` times and
``retry_timeout_s`` in all, moving to the next server each time) on what a retry can fix: a connection refused or
reset, a timeout, and 502/503/504 (a proxy's, or a busy or restarting server's). What the same request would meet
again is not retried: a 4xx, and a 500 (the scorer itself failed on this input). Scoring is a pure function of the
chunk, so a retry cannot double-count: each chunk's answer is placed once, by its index, and the rewards come back in
order.

A chunk the server cannot score (a 422: a sample its scorer rejects, or one that overran the server's deadline) is
scored again one sample at a time, so that only the samples at fault fail: the call then raises an error naming
each of them, or, with ``failed_sample_reward`` set, gives them that reward (and logs a warning).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from rl_core.api import InputError, RLCoreError

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class RemoteConfig:
    """``reward.sources: [{name: remote, url: ..., scorer: ...}]``."""

    #: one server, or ``urls`` for several.
    url: str | None = None
    #: more reward servers (besides ``url``), requests spread over them; a retry moves to the next.
    urls: tuple[str, ...] = ()
    #: the server's scorer to ask (``GET /v1/scorers`` lists them).
    scorer: str = "math_verify"
    #: samples per HTTP request.
    batch_size: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    #: requests under way at once (each holds one connection); the others wait their turn.
    max_in_flight: int = attrs.field(default=16, validator=attrs.validators.gt(0))
    #: seconds one request may take before it is retried.
    timeout_s: float = 60.0
    #: retries of a request that failed in a way a retry can fix (unreachable, timed out, 502/503/504) before the step
    #: fails.
    max_retries: int = attrs.field(default=8, validator=attrs.validators.ge(0))
    #: seconds a request may spend on its retries in all, waits included, before the step fails.
    retry_timeout_s: float = attrs.field(default=120.0, validator=attrs.validators.gt(0))
    #: the first retry's wait, doubled each retry (with jitter).
    backoff_s: float = 0.1
    #: the longest wait between retries.
    max_backoff_s: float = 5.0
    #: environment variable holding the bearer token, if the server wants one.
    token_env: str = "RL_REWARD_SERVER_TOKEN"
    #: the reward of a sample the server cannot score (its scorer rejects it, or it overruns the server's deadline);
    #: unset, such a sample fails the call with an error naming it.
    failed_sample_reward: float | None = None

    def __attrs_post_init__(self) -> None:
        if not self.url and not self.urls:
            raise ValueError("give the reward server's address: url: http://127.0.0.1:8000 (or urls: [...])")

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(u.rstrip("/") for u in ((self.url,) if self.url else ()) + self.urls)


class RewardServerError(RLCoreError):
    """The servers could not score a chunk after every retry."""


class Rejected(RewardServerError):
    """The server answered that it cannot score this request (4xx): retrying it as it is will not help."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


#: one sample the server could not score: (its index in the call, why)
Failure = tuple[int, str]
#: answers a retry can fix: a proxy's, or a server that is busy or restarting
TRANSIENT_STATUS = frozenset({502, 503, 504})


class Transient(RewardServerError):
    """A request that failed in a way a retry can fix: the server unreachable, too slow, busy or restarting."""


class RemoteRewardSource:
    """Implements ``rl_core.api.RewardSource`` over HTTP."""

    def __init__(self, cfg: RemoteConfig) -> None:
        self.cfg = cfg
        token = os.environ.get(cfg.token_env)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> list[Any]:
        if not (len(prompts) == len(responses) == len(metadata)):
            raise InputError("prompts, responses and metadata must have the same length")
        if not prompts:
            return []
        return asyncio.run(self._score_all(list(prompts), list(responses), [dict(m) for m in metadata]))

    async def _score_all(self, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]) -> list[Any]:
        import httpx

        size = self.cfg.batch_size
        turns = asyncio.Semaphore(self.cfg.max_in_flight)
        limits = httpx.Limits(max_connections=self.cfg.max_in_flight)

        async def chunk(client: Any, i: int) -> list[Any]:
            async with turns:  # never more requests than connections: nothing queues inside the pool
                return await self._chunk(
                    client, i // size, prompts[i : i + size], responses[i : i + size], metadata[i : i + size]
                )

        failures: list[Failure] = []

        async def chunk_or_samples(client: Any, i: int) -> list[Any]:
            try:
                return await chunk(client, i)
            except Rejected as exc:
                if exc.status != 422 or min(size, len(prompts) - i) == 1:
                    raise
            # the scorer rejected something in the chunk: each sample alone, so that only those at fault fail
            out = []
            for j in range(i, min(i + size, len(prompts))):
                try:
                    async with turns:
                        out += await self._chunk(client, i // size, [prompts[j]], [responses[j]], [metadata[j]])
                except Rejected as exc:
                    failures.append((j, str(exc)))
                    out.append(self.cfg.failed_sample_reward)
            return out

        async with httpx.AsyncClient(timeout=self.cfg.timeout_s, headers=self.headers, limits=limits) as client:
            parts = await asyncio.gather(*(chunk_or_samples(client, i) for i in range(0, len(prompts), size)))
        if failures:
            listed = "; ".join(f"sample {j}: {why}" for j, why in sorted(failures)[:5])
            more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
            summary = f"{len(failures)} of {len(prompts)} samples could not be scored: {listed}{more}"
            if self.cfg.failed_sample_reward is None:
                raise RewardServerError(f"{summary}. Set failed_sample_reward to give such samples a reward instead")
            log.warning("%s; each got failed_sample_reward %s", summary, self.cfg.failed_sample_reward)
        return [r for part in parts for r in part]

    async def _chunk(
        self, client: Any, index: int, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]
    ) -> list[Any]:
        import stamina

        servers = self.cfg.servers
        first = index % len(servers)
        body = {"scorer": self.cfg.scorer, "prompts": prompts, "responses": responses, "metadata": metadata}
        began, attempts = time.monotonic(), 0
        try:
            async for attempt in stamina.retry_context(
                on=Transient,
                attempts=self.cfg.max_retries + 1,
                timeout=self.cfg.retry_timeout_s,
                wait_initial=self.cfg.backoff_s,
                wait_max=self.cfg.max_backoff_s,
                name="reward-server",
            ):
                with attempt:
                    attempts = attempt.num
                    return await self._post(client, servers[(first + attempts - 1) % len(servers)], body, len(prompts))
        except Transient as exc:
            raise RewardServerError(
                f"could not score {len(prompts)} samples after {attempts} attempts in {time.monotonic() - began:.0f} s "
                f"(max_retries: {self.cfg.max_retries}, retry_timeout_s: {self.cfg.retry_timeout_s:g}); last error: "
                f"{exc}"
            ) from None
        raise AssertionError("the retries return or raise")

    async def _post(self, client: Any, url: str, body: dict[str, Any], samples: int) -> list[Any]:
        """One request's rewards, or the error it met: ``Transient`` when a retry can fix it."""
        import httpx

        try:
            reply = await client.post(f"{url}/v1/score", json=body)
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            raise Transient(f"{url}: {type(exc).__name__}: {exc}") from None
        if reply.status_code < 300:
            rewards: list[Any] = reply.json()["rewards"]
            if len(rewards) != samples:
                raise RewardServerError(f"{url} returned {len(rewards)} rewards for {samples} samples")
            return rewards
        message = _message(reply)
        if reply.status_code in TRANSIENT_STATUS:
            raise Transient(f"{url}: {reply.status_code} {message}")
        if reply.status_code >= 500:
            raise RewardServerError(
                f"reward server {url} could not score the request ({reply.status_code}): {message}. Not retried: the "
                "same input fails again; fix the scorer, or the samples it fails on"
            )
        raise Rejected(f"reward server {url} rejected the request ({reply.status_code}): {message}", reply.status_code)

    def micro_batching(self) -> tuple[int, int] | None:
        """How the first server splits a request for this scorer (inference_micro_batch_size, replicas), as it
        reports on ``GET /v1/scorers``; None when it does not split, or cannot be asked."""
        import httpx

        try:
            reply = httpx.get(f"{self.cfg.servers[0]}/v1/scorers", headers=self.headers, timeout=self.cfg.timeout_s)
            shape = reply.json().get("micro_batching", {}).get(self.cfg.scorer)
        except (httpx.HTTPError, ValueError):
            return None
        return (int(shape[0]), int(shape[1])) if shape else None

    def close(self) -> None:
        return None


def _message(reply: Any) -> str:
    try:
        return str(reply.json().get("error", reply.text))
    except ValueError:
        return reply.text[:200]
