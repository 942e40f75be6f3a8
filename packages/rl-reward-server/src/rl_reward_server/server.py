"""The reward server: a FastAPI app hosting named scorers, batching concurrent requests per scorer.

``POST /v1/score`` takes ``{"scorer", "prompts", "responses", "metadata"?}`` and answers ``{"rewards": [...]}``
in order. Requests to one scorer that arrive together are merged into micro-batches of up to
``micro_batch_size`` samples (waiting at most ``max_wait_ms`` for company), so many small requests become few
scorer calls. Each scorer runs in worker processes of its own (``rl_reward_server.pool``) under a hard deadline
per call, so no input can freeze the server, and a slow input holds up only requests to the same scorer.

Limits, each answered with a status that names it: headers beyond ``max_header_bytes`` all together (431; headers
that do not arrive within ``header_timeout_s`` close the connection: ``rl_reward_server.protocol``), a body
beyond ``max_body_bytes`` however it is framed (counted as it arrives, chunked included: 413), a body that does not
arrive within ``body_timeout_s`` (408), JSON only (415), metadata nested deeper than ``MAX_METADATA_DEPTH`` (422),
more than ``max_queued_samples`` waiting for one scorer (503, retry later). Bad input is a 422 naming the field; a
scorer that overruns the deadline or rejects its input is a 422 for that request alone, and a scorer failure a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from rl_core.api import InputError
from rl_reward_server.pool import InProcess, ScorerLost, ScorerPool, ScoringTimeout, make_aside, make_pool

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class ServerSettings:
    micro_batch_size: int = 64
    max_wait_ms: float = 2.0
    max_batch_size: int = 4096
    max_body_bytes: int = 8 * 1024 * 1024
    #: the longest a request's headers may be (enforced by the HTTP parser, before the token check).
    max_header_bytes: int = 64 * 1024
    #: the longest a request's body may take to arrive.
    body_timeout_s: float = 10.0
    #: the longest a request's headers may take to arrive (from the connection's start, or its last response); a
    #: connection past it is closed.
    header_timeout_s: float = 10.0
    #: the longest one scorer call may run before its process is stopped (hard deadline).
    request_timeout_s: float = 10.0
    #: scorer processes for each hosted scorer (0: in the server's own process, without a deadline).
    workers: int = 1
    #: samples waiting for one scorer beyond which a request gets a 503.
    max_queued_samples: int = 16384
    token: str | None = None


#: how deeply a sample's metadata may nest (objects and lists): deeper is a 422, not a crash in the worker hand-off
MAX_METADATA_DEPTH = 32


def _depth(value: Any) -> int:
    """How deeply ``value`` nests (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_METADATA_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


class Busy(Exception):
    """More samples wait for a scorer than the server queues."""


class ScoreRequest(BaseModel):
    """One scoring request: parallel lists, one entry per sample."""

    model_config = ConfigDict(extra="forbid")

    scorer: str = Field(description="name of a hosted scorer (GET /v1/scorers)")
    prompts: list[str] = Field(min_length=1)
    responses: list[str] = Field(min_length=1)
    metadata: list[dict[str, Any]] | None = Field(default=None, description="per-sample data, e.g. {'answer': '1/2'}")

    @model_validator(mode="after")
    def _same_lengths(self) -> ScoreRequest:
        n = len(self.prompts)
        if len(self.responses) != n or (self.metadata is not None and len(self.metadata) != n):
            raise ValueError(
                f"prompts ({n}), responses ({len(self.responses)}) and metadata "
                f"({'absent' if self.metadata is None else len(self.metadata)}) must have the same length"
            )
        for i, meta in enumerate(self.metadata or ()):
            if _depth(meta) > MAX_METADATA_DEPTH:
                raise ValueError(f"metadata[{i}] nests deeper than {MAX_METADATA_DEPTH} levels")
        return self


class ScoreResponse(BaseModel):
    rewards: list[float | dict[str, float]]


@attrs.define
class _Job:
    prompts: list[str]
    responses: list[str]
    metadata: list[dict[str, Any]]
    future: asyncio.Future[list[Any]]


class Batcher:
    """Merges concurrent jobs for one scorer into micro-batches and runs them in the scorer processes, as many at
    once as there are processes. A call that overran the deadline or lost its process says only that one of its
    requests is slow: each of them is scored again alone in the lane aside (``aside``), behind the other suspects
    and not in front of new requests, which keep the scorer's own processes."""

    def __init__(
        self,
        name: str,
        pool: ScorerPool | InProcess,
        settings: ServerSettings,
        metrics: _Metrics,
        aside: ScorerPool | None = None,
    ) -> None:
        self.name, self.pool, self.settings, self.metrics, self.aside = name, pool, settings, metrics, aside
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.waiting = 0  # samples submitted and not yet answered
        self._calls: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop())

    def stop(self) -> None:
        for task in (self.task, *self._calls):
            if task is not None:
                task.cancel()

    async def submit(self, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]) -> list[Any]:
        if self.waiting and self.waiting + len(prompts) > self.settings.max_queued_samples:
            raise Busy(f"{self.waiting} samples already wait for scorer {self.name!r}; retry later")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.waiting += len(prompts)
        try:
            await self.queue.put(_Job(prompts, responses, metadata, future))
            return await future
        finally:
            self.waiting -= len(prompts)

    async def _loop(self) -> None:
        """Take everything already queued (up to the micro-batch size) at once; wait at most ``max_wait_ms`` for
        more only while the batch is short. Under load the queue fills while the scorers run, so batches form
        without adding latency. A batch starts as soon as a process is free for it."""
        free = asyncio.Semaphore(self.pool.size)
        while True:
            jobs = await self._collect()
            await free.acquire()
            self._spawn(self._run(jobs)).add_done_callback(lambda _task: free.release())

    async def _collect(self) -> list[_Job]:
        jobs = [await self.queue.get()]
        size = len(jobs[0].prompts)
        deadline = time.monotonic() + self.settings.max_wait_ms / 1000
        while size < self.settings.micro_batch_size:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), remaining)
                except TimeoutError:
                    break
            jobs.append(job)
            size += len(job.prompts)
        return jobs

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return task

    async def _run(self, jobs: list[_Job], pool: ScorerPool | InProcess | None = None) -> None:
        pool = pool or self.pool
        prompts = [p for j in jobs for p in j.prompts]
        responses = [r for j in jobs for r in j.responses]
        metadata = [m for j in jobs for m in j.metadata]
        self.metrics.batch_size.labels(self.name).observe(len(prompts))
        try:
            rewards = await pool.score(self.name, prompts, responses, metadata)
            if len(rewards) != len(prompts):
                raise RuntimeError(f"scorer returned {len(rewards)} rewards for {len(prompts)} samples")
        except Exception as exc:
            if len(jobs) == 1:
                if not jobs[0].future.done():
                    jobs[0].future.set_exception(exc)
            elif isinstance(exc, (ScoringTimeout, ScorerLost)) and self.aside is not None:
                self.metrics.set_aside.labels(self.name).inc(len(jobs))
                for job in jobs:  # each suspect alone, in the lane aside, answered as soon as its own call ends
                    self._spawn(self._run([job], self.aside))
            else:  # a fast failure: find the failing request here, each scored alone
                for job in jobs:
                    await self._run([job], pool)
            return
        offset = 0
        for job in jobs:
            n = len(job.prompts)
            if not job.future.done():
                job.future.set_result(list(rewards[offset : offset + n]))
            offset += n


@attrs.define
class _Metrics:
    registry: CollectorRegistry
    http: Counter
    http_latency: Histogram
    requests: Counter
    samples: Counter
    batch_size: Histogram
    latency: Histogram
    set_aside: Counter

    @classmethod
    def create(cls) -> _Metrics:
        reg = CollectorRegistry()
        ProcessCollector(registry=reg)  # the server process's memory, CPU time, open files
        return cls(
            registry=reg,
            http=Counter("reward_http_requests_total", "every HTTP request", ["path", "status"], registry=reg),
            http_latency=Histogram(
                "reward_http_request_seconds",
                "HTTP latency, end to end (headers in to response out)",
                ["path"],
                registry=reg,
            ),
            requests=Counter("reward_requests_total", "scoring requests", ["scorer", "status"], registry=reg),
            samples=Counter("reward_samples_total", "samples scored", ["scorer"], registry=reg),
            batch_size=Histogram(
                "reward_batch_size",
                "samples per scorer call",
                ["scorer"],
                registry=reg,
                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            ),
            latency=Histogram("reward_request_seconds", "time in the batcher and scorer", ["scorer"], registry=reg),
            set_aside=Counter(
                "reward_requests_set_aside_total",
                "requests scored again alone in the lane aside (their call overran the deadline)",
                ["scorer"],
                registry=reg,
            ),
        )


_PATHS = ("/v1/score", "/v1/scorers", "/health", "/ready", "/metrics", "/openapi.json", "/docs")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message})


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, counted as it arrives whatever its framing (a Content-Length, chunks, or none); None as soon as it
    passes ``limit`` bytes, before the rest is read."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # starlette's cache of Request.body(): the route reads the body from here
    return body


def create_app(
    scorers: Mapping[str, str],
    settings: ServerSettings | None = None,
    shapes: Mapping[str, tuple[int, int]] | None = None,
) -> FastAPI:
    """The ASGI app hosting ``scorers`` (name -> ``--scorer`` spec), built in ``settings.workers`` processes.
    ``shapes``: how each scorer splits a request (inference_micro_batch_size, replicas), if it does."""
    settings = settings or ServerSettings()
    metrics = _Metrics.create()
    # a pool of processes for each scorer: an input that is slow for one scorer holds up no other
    pools = {name: make_pool([spec], settings.workers, settings.request_timeout_s) for name, spec in scorers.items()}
    asides = {name: make_aside([spec], settings.workers, settings.request_timeout_s) for name, spec in scorers.items()}
    batchers = {name: Batcher(name, pools[name], settings, metrics, asides[name]) for name in scorers}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        every = [*pools.values(), *filter(None, asides.values())]
        for pool in every:
            await pool.start()
        for b in batchers.values():
            b.start()
        yield
        for b in batchers.values():
            b.stop()
        for pool in every:
            pool.close()

    app = FastAPI(title="rl-reward-server", version=_version(), description=__doc__, lifespan=lifespan)

    @app.middleware("http")
    async def _measure(request: Request, call_next: Any) -> Response:
        """Every request counted by path and status, and timed end to end (rejections included)."""
        start = time.perf_counter()
        path = request.url.path if request.url.path in _PATHS else "other"
        response = await _guard(request, call_next, settings)
        metrics.http.labels(path, str(response.status_code)).inc()
        metrics.http_latency.labels(path).observe(time.perf_counter() - start)
        return response

    _add_error_handlers(app)
    _add_routes(app, batchers, settings, metrics, shapes or {})
    return app


async def _guard(request: Request, call_next: Any, settings: ServerSettings) -> Response:
    """Headers' size, the bearer token, and a POST body's type, size and arrival time, checked before a route runs."""
    header_bytes = sum(len(k) + len(v) + 4 for k, v in request.scope["headers"])
    if header_bytes > settings.max_header_bytes:
        return _error(431, f"request headers of {header_bytes} bytes exceed the limit of {settings.max_header_bytes}")
    if settings.token and request.url.path not in ("/health",):
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {settings.token}".encode()):
            return _error(401, "missing or wrong bearer token (Authorization: Bearer TOKEN)")
    if request.method == "POST":
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            return _error(415, "the body must be JSON (Content-Type: application/json)")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > settings.max_body_bytes:
            return _error(413, f"body of {length} bytes exceeds the limit of {settings.max_body_bytes}")
        try:  # read here, under a deadline: a half-sent body must not hold a connection open
            body = await asyncio.wait_for(_read_body(request, settings.max_body_bytes), settings.body_timeout_s)
        except TimeoutError:
            return _error(408, f"the body did not arrive within {settings.body_timeout_s:g} s")
        if body is None:
            return _error(413, f"the body exceeds the limit of {settings.max_body_bytes} bytes")
    return await call_next(request)


def _parse_error(cause: BaseException | None) -> str:
    """What the JSON parser found wrong, in the sender's terms."""
    if isinstance(cause, RecursionError):
        return f"it nests too deeply (metadata may nest {MAX_METADATA_DEPTH} levels)"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return f"a number in it is too large ({cause}); send such a number as a string"
    return str(cause) if cause is not None else "not valid JSON"


def _add_error_handlers(app: FastAPI) -> None:
    """Every error answered as JSON ``{"error": ...}`` with a status that says what was wrong."""

    @app.exception_handler(RecursionError)
    async def _too_deep(_request: Request, _exc: RecursionError) -> JSONResponse:
        return _error(422, f"the body nests too deeply (metadata may nest {MAX_METADATA_DEPTH} levels)")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI could not parse the body: say why, from the parser's own error
            return _error(422, f"the body could not be parsed as JSON: {_parse_error(exc.__cause__)}")
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            problems.append(f"{where}: {err.get('msg')}")
        return _error(422, "; ".join(problems))


def _add_routes(
    app: FastAPI,
    batchers: Mapping[str, Batcher],
    settings: ServerSettings,
    metrics: _Metrics,
    shapes: Mapping[str, tuple[int, int]],
) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> dict[str, Any]:
        return {"ready": all(b.task is not None for b in batchers.values()), "scorers": sorted(batchers)}

    @app.get("/v1/scorers")
    async def list_scorers() -> dict[str, Any]:
        """The hosted scorers, and how each splits a request (inference_micro_batch_size, replicas), if it does."""
        return {"scorers": sorted(batchers), "micro_batching": {k: list(v) for k, v in shapes.items()}}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/score", response_model=ScoreResponse)
    async def score(req: ScoreRequest) -> Any:
        return await _score(req, batchers, settings, metrics)


async def _score(
    req: ScoreRequest, batchers: Mapping[str, Batcher], settings: ServerSettings, metrics: _Metrics
) -> Any:
    batcher = batchers.get(req.scorer)
    if batcher is None:
        return _error(404, f"unknown scorer {req.scorer!r}; hosted: {', '.join(sorted(batchers))}")
    if len(req.prompts) > settings.max_batch_size:
        return _error(413, f"{len(req.prompts)} samples exceed the maximum batch size of {settings.max_batch_size}")
    start = time.perf_counter()
    metadata = req.metadata or [{} for _ in req.prompts]
    try:
        rewards = await batcher.submit(req.prompts, req.responses, metadata)
    except Busy as exc:
        metrics.requests.labels(req.scorer, "busy").inc()
        return JSONResponse(status_code=503, content={"error": str(exc)}, headers={"Retry-After": "1"})
    except (InputError, ScoringTimeout, ScorerLost) as exc:
        metrics.requests.labels(req.scorer, "rejected").inc()
        return _error(422, f"scorer {req.scorer!r} could not score this request: {exc}")
    except Exception as exc:
        log.exception("scorer %s failed", req.scorer)
        metrics.requests.labels(req.scorer, "error").inc()
        return _error(500, f"scorer {req.scorer!r} failed: {exc}")
    metrics.requests.labels(req.scorer, "ok").inc()
    metrics.samples.labels(req.scorer).inc(len(rewards))
    metrics.latency.labels(req.scorer).observe(time.perf_counter() - start)
    return {"rewards": rewards}


def _version() -> str:
    from rl_reward_server.__about__ import __version__

    return __version__
