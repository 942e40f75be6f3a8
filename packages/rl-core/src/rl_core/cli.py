"""The ``rl-core`` command line: ``run``, ``plugins``, ``plot``, ``config-reference``, plus plugin subcommands.

Errors are one clear message (exit status 2), with the traceback only under ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rl_core.__about__ import __version__
from rl_core.errors import RLCoreError
from rl_core.registry import KINDS, Registry

console = Console()
err_console = Console(stderr=True)


def _split_config(items: Sequence[str]) -> tuple[Path | None, list[str]]:
    """``[CONFIG] [key=value ...]``: the first item is the config file unless it is an override."""
    if items and "=" not in items[0]:
        return Path(items[0]), list(items[1:])
    return None, list(items)


def _components(registry: Registry, plugin: str) -> list[dict[str, Any]]:
    out = []
    for kind in KINDS:
        for name, spec in registry.specs(kind).items():  # type: ignore[arg-type]
            if registry.owner(kind, name).name == plugin:  # type: ignore[arg-type]
                out.append(
                    {
                        "kind": kind,
                        "name": name,
                        "priority": getattr(spec, "priority", None),
                        "config_key": getattr(spec, "config_key", None),
                    }
                )
    return out


def plugins_report(registry: Registry) -> list[dict[str, Any]]:
    return [
        {
            "plugin": info.name,
            "distribution": info.distribution,
            "version": info.version,
            "status": info.status,
            "error": info.error,
            "hooks": list(info.hooks),
            "components": _components(registry, info.name) if info.status == "loaded" else [],
        }
        for info in registry.plugins.values()
    ]


def cmd_plugins(args: argparse.Namespace, registry: Registry) -> int:
    if args.explain is not None:
        return explain(args.explain, registry, as_json=args.json)
    report = plugins_report(registry)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    table = Table(title="rl-core plugins")
    for column in ("plugin", "distribution", "version", "status", "components (kind: name, priority)"):
        table.add_column(column)
    for row in report:
        parts = [
            f"{c['kind']}: {c['name']}" + (f" ({c['priority']})" if c["priority"] else "") for c in row["components"]
        ]
        status = row["status"] if not row["error"] else f"{row['status']}: {row['error']}"
        table.add_row(row["plugin"], row["distribution"], row["version"], status, "\n".join(parts))
    console.print(table)
    return 0


def explain(items: Sequence[str], registry: Registry, *, as_json: bool) -> int:
    from rl_core.config import load_config
    from rl_core.run import select_components

    path, overrides = _split_config(items)
    config = load_config(path, overrides, registry)
    chosen = select_components(config, registry)
    lines = {"algorithm": f"algorithm: {config.algorithm}", "training_backend": chosen.backend.describe()}
    if chosen.engine is not None:
        lines["rollout_engine"] = chosen.engine.describe()
        lines["weight_transport"] = f"weight transport: {chosen.transport.name}"
        lines["reward_sources"] = "reward sources: " + ", ".join(chosen.rewards)
    if as_json:
        data: dict[str, Any] = {"algorithm": config.algorithm, "training_backend": _sel(chosen.backend)}
        if chosen.engine is not None:
            data["rollout_engine"] = _sel(chosen.engine)
            data["weight_transport"] = chosen.transport.name
            data["reward_sources"] = list(chosen.rewards)
        print(json.dumps(data, indent=2))
    else:
        for line in lines.values():
            console.print(line)
    return 0


def _sel(selection: Any) -> dict[str, Any]:
    return {
        "chosen": selection.chosen.name,
        "priority": selection.chosen.priority,
        "reason": selection.reason,
        "runners_up": [{"name": s.name, "priority": s.priority} for s in selection.runners_up],
    }


def cmd_run(args: argparse.Namespace, registry: Registry) -> int:
    from rl_core.config import load_config
    from rl_core.run import run_config

    path, overrides = _split_config(args.items)
    config = load_config(path, overrides, registry)
    metrics = run_config(config, registry, console)
    shown = {k: round(v, 4) for k, v in metrics.items() if k.startswith(("val/", "reward"))}
    console.print(f"[bold green]done[/bold green] {shown}")
    return 0


def cmd_plot(args: argparse.Namespace, _registry: Registry) -> int:
    from rl_core.plot import plot_run

    out = plot_run(Path(args.run_dir), Path(args.output) if args.output else None)
    console.print(f"wrote {out}")
    return 0


def cmd_config_reference(args: argparse.Namespace, registry: Registry) -> int:
    from rl_core.docs import config_reference

    text = config_reference(registry)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def versions(registry: Registry) -> str:
    lines = [f"rl-core {__version__}"]
    lines += [
        f"{p.distribution} {p.version} ({p.name}: {p.status})" for p in registry.plugins.values() if p.name != "core"
    ]
    return "\n".join(lines)


def build_parser(registry: Registry) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rl-core", description="RL post-training for language models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--version", action="store_true", help="print each package's version")
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("run", help="run a config (no config: the built-in default recipe)")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [dotted.key=value ...]")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("plugins", help="list plugins; --explain shows what a config selects")
    p.add_argument("--json", action="store_true")
    p.add_argument("--explain", nargs="*", metavar="[CONFIG] [dotted.key=value ...]")
    p.set_defaults(handler=cmd_plugins)

    p = sub.add_parser("plot", help="draw a run's reward, KL, loss and phase-time curves to a PNG")
    p.add_argument("run_dir")
    p.add_argument("-o", "--output", help="PNG path (default RUN_DIR/curves.png)")
    p.set_defaults(handler=cmd_plot)

    p = sub.add_parser("config-reference", help="print the config reference (Markdown) from the attrs classes")
    p.add_argument("-o", "--output")
    p.set_defaults(handler=cmd_config_reference)

    for name, spec in registry.specs("cli_command").items():
        p = sub.add_parser(name, help=spec.help)
        spec.configure(p)
        p.set_defaults(handler=lambda a, _r, spec=spec: spec.run(a))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("rl_core").setLevel(logging.DEBUG if debug else logging.INFO)
    try:
        registry = Registry.discover()
        parser = build_parser(registry)
        args = parser.parse_args(argv)
        if args.version:
            print(versions(registry))
            return 0
        if not args.command:
            parser.print_help()
            return 0
        return int(args.handler(args, registry) or 0)
    except RLCoreError as exc:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/bold red]")
        return 130
    except Exception as exc:
        if debug:
            raise
        err_console.print(
            f"[bold red]error:[/bold red] {type(exc).__name__}: {escape(str(exc))}\n(run with --debug for the traceback)",
            highlight=False,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
