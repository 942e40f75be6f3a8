"""Entry point of the reward-server plugin: light (no fastapi, torch or math-verify at import time).

Registers the ``remote`` client reward source, the ``math_verify`` and ``reward_model`` scorers (usable
in-process or hosted by the server), and the ``rl-core reward-server`` subcommand.
"""

from __future__ import annotations

import argparse
from typing import Any

from rl_core.api import CliCommandSpec, RewardSource, RewardSourceSpec, hookimpl


def _remote(options: Any) -> RewardSource:
    from rl_reward_server.client import RemoteRewardSource

    return RemoteRewardSource(options)


def _math_verify(options: Any) -> RewardSource:
    from rl_reward_server.scorers import MathVerifyConfig, MathVerifyScorer

    return MathVerifyScorer(cfg=options or MathVerifyConfig())


def _reward_model(options: Any) -> RewardSource:
    from rl_reward_server.scorers import RewardModelScorer

    return RewardModelScorer(options)


@hookimpl
def rl_reward_sources() -> list[RewardSourceSpec]:
    from rl_reward_server.client import RemoteConfig
    from rl_reward_server.scorers import MathVerifyConfig, RewardModelConfig

    return [
        RewardSourceSpec(
            name="remote",
            factory=_remote,
            config_class=RemoteConfig,
            description="scores through rl-reward-server over HTTP",
            package="rl-reward-server",
        ),
        RewardSourceSpec(
            name="math_verify",
            factory=_math_verify,
            config_class=MathVerifyConfig,
            description="math answer equivalence (math-verify)",
            package="rl-reward-server",
        ),
        RewardSourceSpec(
            name="reward_model",
            factory=_reward_model,
            config_class=RewardModelConfig,
            description="Hugging Face sequence-classification reward model",
            package="rl-reward-server",
        ),
    ]


def _configure(parser: argparse.ArgumentParser) -> None:
    from rl_reward_server.cli import add_serve_arguments

    sub = parser.add_subparsers(dest="reward_server_command", required=True)
    add_serve_arguments(sub.add_parser("serve", help="start the reward server"))


def _run(args: argparse.Namespace) -> int:
    from rl_reward_server.cli import serve

    return serve(args)


@hookimpl
def rl_cli_commands() -> list[CliCommandSpec]:
    return [CliCommandSpec(name="reward-server", help="the HTTP reward server", configure=_configure, run=_run)]
