"""A run context for driving multi-turn episodes outside a run (tests, benchmarks): only what
``rl_core.training.episodes`` reads (config, tokenizer, engine, environment runner); no backend, run folder,
console or checkpoints."""

from __future__ import annotations

from typing import Any

from rl_core.training.context import RunContext


def episode_context(
    config: Any, engine: Any, tokenizer: Any, runner: Any, engine_name: str = "test", hook: Any = None
) -> RunContext:
    unused: dict[str, Any] = {"run_dir": None, "console": None, "backend": None, "checkpoints": None}
    return RunContext(
        config=config,
        hook=hook,
        tokenizer=tokenizer,
        device="cpu",
        engine=engine,
        engine_name=engine_name,
        rewards=[],
        loggers=[],
        environment=runner,
        **unused,
    )
