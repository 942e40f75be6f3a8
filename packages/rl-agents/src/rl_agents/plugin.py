"""Entry point of the agents plugin: light (no fastapi, openai or torch at import time). Registers the ``agent``
environment."""

from __future__ import annotations

from typing import Any

from rl_agents.config import AgentConfig
from rl_core.api import EnvironmentSpec, EpisodeDriver, hookimpl


def _agent(options: Any) -> EpisodeDriver:
    from rl_agents.host import AgentHost

    return AgentHost(options or AgentConfig())


@hookimpl
def rl_environments() -> list[EnvironmentSpec]:
    return [
        EnvironmentSpec(
            name="agent",
            factory=_agent,
            config_class=AgentConfig,
            description="an OpenAI-client program (environment.entry) through an endpoint the run serves",
            package="rl-agents",
        )
    ]
