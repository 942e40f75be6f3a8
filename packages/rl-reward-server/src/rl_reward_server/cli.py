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

from rl_core.api import ConfigError, Registry, RLCoreError

TOKEN_ENV = "RL_REWARD_SERVER_TOKEN"


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"port {port} is out of range (1-65535)")
    return port


def _number(kind: type, *, minimum: float, inclusive: bool = False, maximum: float | None = None) -> Any:
    """An argparse type: a finite ``kind`` above ``minimum`` (or at it, if ``inclusive``) and up to ``maximum``."""

    def parse(text: str) -> Any:
        import math

        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {minimum:g}, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:g}, got {text}")
        return value

    return parse


#: bounds that keep every timer and buffer a real one: a day, an hour
_DAY_S, _HOUR_MS = 86_400.0, 3_600_000.0


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scorer",
        action="append",
        default=[],
        metavar="NAME[:key=value,...]",
        help="a scorer to host (repeatable); default: math_verify",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--token", default=None, help=f"bearer token required on every request (or ${TOKEN_ENV})")
    p.add_argument(
        "--allow-no-token", action="store_true", help="serve a non-loopback address without a token (not advised)"
    )
    positive = _number(int, minimum=0)
    p.add_argument("--micro-batch-size", type=positive, default=64, help="samples per scorer call")
    p.add_argument(
        "--max-wait-ms",
        type=_number(float, minimum=0, inclusive=True, maximum=_HOUR_MS),
        default=2.0,
        help="how long a short batch waits for more requests",
    )
    p.add_argument("--max-batch-size", type=positive, default=4096, help="most samples one request may carry")
    p.add_argument("--max-body-bytes", type=positive, default=8 * 1024 * 1024, help="largest request body")
    p.add_argument("--max-header-bytes", type=positive, default=64 * 1024, help="longest request headers, all together")
    for flag, what in (
        ("--body-timeout-s", "longest a body may take to arrive"),
        ("--header-timeout-s", "longest a request's headers may take to arrive; a connection past it is closed"),
        (
            "--request-timeout-s",
            "hard deadline of one scorer call; its process is stopped and replaced past it (the request gets a 422)",
        ),
    ):
        p.add_argument(flag, type=_number(float, minimum=0, maximum=_DAY_S), default=10.0, help=what)
    p.add_argument(
        "--workers",
        type=_number(int, minimum=0, inclusive=True),
        default=1,
        help="scorer processes for each hosted scorer, each scoring one micro-batch at a time (a call that overruns "
        "the deadline holds up one of them); 0: score in the server's own process (faster for cheap rules, but no "
        "deadline: only for scorers that cannot hang)",
    )
    p.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="the event loop (auto: uvloop where it is installed)",
    )
    p.add_argument(
        "--max-queued-samples",
        type=positive,
        default=16384,
        help="samples waiting for one scorer beyond which requests get a 503 (retry later)",
    )


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from rl_reward_server.hosting import parse_scorer
    from rl_reward_server.protocol import header_deadline_protocol
    from rl_reward_server.server import ServerSettings, create_app

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    if token is not None and not token.strip():
        raise ConfigError(
            f"--token is empty (is the variable you passed unset?): give a token, or leave out --token and {TOKEN_ENV}"
        )
    if not token and not _loopback(args.host) and not args.allow_no_token:
        raise ConfigError(
            f"--host {args.host} serves other machines, and no token is set: anyone who reaches the port could use "
            f"the scorers. Give --token (or {TOKEN_ENV}), bind 127.0.0.1, or pass --allow-no-token"
        )
    registry = Registry.discover()
    specs = args.scorer or ["math_verify"]
    parsed = [parse_scorer(s, registry) for s in specs]  # option errors now, before any process starts
    shapes = {
        name: (cfg.inference_micro_batch_size, cfg.replicas)
        for name, _spec, cfg in parsed
        if hasattr(cfg, "inference_micro_batch_size") and hasattr(cfg, "replicas")
    }
    settings = ServerSettings(
        micro_batch_size=args.micro_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_batch_size=args.max_batch_size,
        max_body_bytes=args.max_body_bytes,
        max_header_bytes=args.max_header_bytes,
        body_timeout_s=args.body_timeout_s,
        header_timeout_s=args.header_timeout_s,
        request_timeout_s=args.request_timeout_s,
        workers=args.workers,
        max_queued_samples=args.max_queued_samples,
        token=token or None,
    )
    app = create_app({name: text for (name, _s, _c), text in zip(parsed, specs, strict=True)}, settings, shapes)
    print(
        f"rl-reward-server: scorers {', '.join(n for n, _s, _c in parsed)} on http://{args.host}:{args.port}",
        flush=True,
    )
    # h11 enforces a limit on request headers (read before the token check); httptools has none
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        http=header_deadline_protocol(settings.header_timeout_s),
        loop=args.loop,
        h11_max_incomplete_event_size=settings.max_header_bytes,
    )
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
