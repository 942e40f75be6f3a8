"""``rl-reward-server serve`` (also ``rl-core reward-server serve``).

Scorers are named like reward sources, with options: ``--scorer math_verify``,
``--scorer reward_model:path=/models/rm,inference_micro_batch_size=16``, ``--scorer exact_match``. Any reward
source registered with rl-core (by the core or a plugin) can be hosted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from rl_core.api import ConfigError, RLCoreError

TOKEN_ENV = "RL_REWARD_SERVER_TOKEN"


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scorer",
        action="append",
        default=[],
        metavar="NAME[:key=value,...]",
        help="a scorer to host (repeatable); default: math_verify",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token", default=None, help=f"bearer token required on every request (or ${TOKEN_ENV})")
    p.add_argument("--micro-batch-size", type=int, default=64, help="samples per scorer call across requests")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a short batch waits for more requests")
    p.add_argument("--max-batch-size", type=int, default=4096, help="most samples one request may carry")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)


def parse_scorer(text: str, registry: Any) -> tuple[str, Any]:
    """``name:key=value,key=value`` -> (name, reward source built with those options)."""
    import yaml

    from rl_core.api import structure_section

    name, _, rest = text.partition(":")
    spec = registry.specs("reward_source").get(name)
    if spec is None or name == "remote":
        known = ", ".join(n for n in sorted(registry.specs("reward_source")) if n != "remote")
        raise ConfigError(f"--scorer {name!r}: not a scorer this server can host; known: {known}")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--scorer {text!r}: options are key=value pairs separated by commas")
        options[key] = yaml.safe_load(value)
    cfg = structure_section(spec.config_class, options, f"--scorer {name}") if spec.config_class is not None else None
    return name, spec.factory(cfg)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from rl_core.api import Registry
    from rl_reward_server.server import ServerSettings, create_app

    registry = Registry.discover()
    scorers = dict(parse_scorer(s, registry) for s in (args.scorer or ["math_verify"]))
    settings = ServerSettings(
        micro_batch_size=args.micro_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_batch_size=args.max_batch_size,
        max_body_bytes=args.max_body_bytes,
        token=args.token or os.environ.get(TOKEN_ENV) or None,
    )
    print(f"rl-reward-server: scorers {', '.join(scorers)} on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(create_app(scorers, settings), host=args.host, port=args.port, log_level="warning")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-reward-server", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_arguments(sub.add_parser("serve", help="start the reward server"))
    args = parser.parse_args(argv)
    try:
        return serve(args)
    except RLCoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
