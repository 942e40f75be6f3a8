"""Entry point of the Megatron backend: light (no megatron or torch at import time)."""

from __future__ import annotations

import argparse

from rl_backend_megatron.config import MegatronConfig
from rl_core.api import CliCommandSpec, TrainingBackendSpec, hookimpl, lazy


def _configure_cli(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="megatron_command", required=True)
    convert = sub.add_parser("convert", help="convert a Hugging Face checkpoint once into the Megatron folder")
    convert.add_argument("hf_dir")
    convert.add_argument("--force", action="store_true", help="redo it even if a finished conversion exists")


def _run_cli(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rl_backend_megatron.convert import convert_once

    convert_once(Path(args.hf_dir), force=args.force)
    return 0


@hookimpl
def rl_cli_commands() -> list[CliCommandSpec]:
    return [CliCommandSpec(name="megatron", help="megatron backend tools", configure=_configure_cli, run=_run_cli)]


@hookimpl
def rl_training_backends() -> list[TrainingBackendSpec]:
    return [
        TrainingBackendSpec(
            name="megatron",
            priority=200,
            config_key="policy.megatron_cfg",
            config_class=MegatronConfig,
            factory=lazy("rl_backend_megatron.backend:make_backend"),
            description="megatron-core (TP/PP/DP) with one-time HF -> Megatron conversion",
            package="rl-backend-megatron",
        )
    ]
