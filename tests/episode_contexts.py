"""A run context for driving multi-turn episodes in tests: only what ``rl_core.training.episodes`` reads (config,
tokenizer, engine, environment runner); no backend, hooks or run folder."""

from typing import Any

from rl_core.contracts.protocols import Transition
from rl_core.rewards.environments import Calculator


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


class ScriptedCalculator(Calculator):
    """The calculator, but a model turn that is not a call still gets an observation (" Try again:"): every episode
    runs all its turns (tests/rl_agents/scripted_agents.py's ``scripted`` is this as an agent program)."""

    def step(self, state: Any, action: str) -> Transition:
        answer = super().step(state, action)
        return answer if not answer.done else Transition(observation=" Try again:", state=state)
