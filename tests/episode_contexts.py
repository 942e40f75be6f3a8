"""A run context for driving multi-turn episodes in tests: only what ``rl_core.training.episodes`` reads (config,
tokenizer, engine, environment runner); no backend, hooks or run folder."""

from typing import Any


def episode_context(config: Any, engine: Any, tokenizer: Any, runner: Any, engine_name: str = "test") -> Any:
    from rl_core.training.context import RunContext

    return RunContext(
        config=config,
        hook=None,
        run_dir=None,
        console=None,
        tokenizer=tokenizer,
        device="cpu",
        backend=None,
        engine=engine,
        engine_name=engine_name,
        rewards=[],
        checkpoints=None,
        loggers=[],
        environment=runner,
    )
