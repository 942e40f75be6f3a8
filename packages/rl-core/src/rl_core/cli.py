"""The ``rl-core`` command line: ``run``, ``eval``, ``plugins``, ``certify``, ``plot``, ``config-reference``, plus
plugin subcommands.

Errors are one clear line (exit status 2), with the traceback only under ``--debug``; lines are never wrapped, so
that piped output reads whole. ``--verbose`` shows third-party output (workers, vLLM, Ray) on the terminal too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rl_core.__about__ import __version__
from rl_core.base.errors import InputError, RLCoreError
from rl_core.base.schema import to_dict
from rl_core.certify import certify
from rl_core.certify.command import KIND_FLAGS
from rl_core.config.loader import load_config
from rl_core.config.reference import config_reference
from rl_core.data.prompts import load_split
from rl_core.distributed.placement import detected_device, engine_layout, policy_layout
from rl_core.launch.checks import check_loggers
from rl_core.launch.evaluate import EvalSettings, eval_folder, run_eval
from rl_core.launch.run import run_config
from rl_core.outputs.checkpoint import CheckpointManager
from rl_core.outputs.console import RunConsole
from rl_core.outputs.logs import run_logs
from rl_core.outputs.plot import plot_run
from rl_core.plugins.registry import Registry
from rl_core.plugins.selection import Selection, select
from rl_core.plugins.specs import KINDS, AlgorithmSpec, CliCommandSpec, RolloutEngineSpec, TrainingBackendSpec

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def _split_config(items: Sequence[str]) -> tuple[Path | None, list[str]]:
    """``[CONFIG] [key=value ...]``: the first item is the config file unless it is an override."""
    if items and "=" not in items[0]:
        return Path(items[0]), list(items[1:])
    return None, list(items)


def _components(registry: Registry, plugin: str) -> list[dict[str, Any]]:
    out = []
    for kind in KINDS:
        for name, spec in registry.specs(kind).items():
            if registry.owner(kind, name).name == plugin:
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
            "warning": info.warning,
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
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return 0
    table = Table(title="rl-core plugins")
    for column in ("plugin", "distribution", "version", "status", "components (kind: name, priority)"):
        table.add_column(column)
    for row in report:
        parts = [
            f"{c['kind']}: {c['name']}" + (f" ({c['priority']})" if c["priority"] else "") for c in row["components"]
        ]
        status = row["status"] if not row["error"] else f"{row['status']}: {row['error']}"
        if row["warning"]:
            status += f" (warning: {row['warning']})"
        table.add_row(row["plugin"], row["distribution"], row["version"], status, "\n".join(parts))
    console.print(table)
    return 0


def explain(items: Sequence[str], registry: Registry, *, as_json: bool) -> int:

    path, overrides = _split_config(items)
    config = load_config(path, overrides, registry)
    chosen = select(config, registry, detected_device(config))
    if as_json:
        data: dict[str, Any] = {"algorithm": config.algorithm, "training_backend": _sel(chosen.backend)}
        if chosen.engine is not None:
            data["rollout_engine"] = _sel(chosen.engine)
            data["weight_transport"] = chosen.route
            data["reward_sources"] = list(chosen.rewards)
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        for line in chosen.lines().values():
            console.print(escape(line), highlight=False)
    return 0


def _sel(selection: Any) -> dict[str, Any]:
    return {
        "chosen": selection.chosen.name,
        "priority": selection.chosen.priority,
        "reason": selection.reason,
        "runners_up": [{"name": s.name, "priority": s.priority} for s in selection.runners_up],
    }


def cmd_run(args: argparse.Namespace, registry: Registry) -> int:

    path, overrides = _split_config(args.items)
    config = load_config(path, overrides, registry)
    if args.dry_run:
        return dry_run(config, registry)
    if args.debug:  # every refit's weights verified
        config = attrs.evolve(config, health=attrs.evolve(config.health, verify_refit_every=1))
    run_console = RunConsole(console, progress=config.logger.progress, verbose=args.verbose)
    run_dir = Path(config.run_dir).resolve()
    with run_logs(run_dir, verbose=args.verbose or args.debug, packages=registry.packages()), _sigterm_interrupts():
        try:
            run_config(config, registry, run_console)
        except KeyboardInterrupt:
            steps = [c.step for c in CheckpointManager(run_dir, config.checkpointing).complete()]
            run_console.interrupted(steps[-1] if steps else None)
            return 130
    return 0


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a scheduler's stop, ``kill``) ends the run as Ctrl-C does: everything released, one line said."""

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def dry_run(config: Any, registry: Registry) -> int:
    """What ``rl-core run`` would do, without starting anything: the resolved config, the components chosen and
    why, where the workers would go, how much data there is."""

    device = detected_device(config)
    chosen = select(config, registry, device)
    check_loggers(config, registry)
    console.print("== resolved config", style="bold")
    sys.stdout.write(yaml.safe_dump(used_settings(config, chosen, registry), sort_keys=False))
    console.print("== components", style="bold")
    for line in chosen.lines().values():
        console.print(escape(line), highlight=False)
    console.print("== placement", style="bold")
    policy = policy_layout(config, device)
    console.print(f"device: {device}; policy: {policy.size} rank(s), {policy.num_gpus:g} GPU each", highlight=False)
    if chosen.algorithm.critic is not None:
        critic = policy_layout(chosen.algorithm.critic(config), device)
        console.print(f"critic: {critic.size} rank(s), {critic.num_gpus:g} GPU each", highlight=False)
    if chosen.engine is not None:
        engine = engine_layout(config, device)
        colocated = " (colocated with the policy)" if engine.shared else ""
        console.print(
            f"rollout engine: {engine.size} replica(s), {engine.num_gpus:g} GPU each{colocated}", highlight=False
        )
    console.print("== data", style="bold")
    val_key = f"{chosen.algorithm.config_key}.max_val_samples"
    val_limit = getattr(config.sections.get(chosen.algorithm.config_key or ""), "max_val_samples", None)
    for split in ("train", "val"):
        rows = len(load_split(config.data, split, registry.task))
        line = f"{split}: {rows} rows"
        if split == "val" and val_limit is not None:
            line += f"; each validation uses {min(rows, val_limit)} ({val_key}: {val_limit})"
        console.print(line, highlight=False)
    if config.warmup_recipe:
        console.print(f"warm-up: {config.warmup_recipe} runs first, in RUN_DIR/warmup", highlight=False)
    console.print(f"run folder: {Path(config.run_dir).resolve()} (dry run: nothing started)", highlight=False)
    return 0


def used_settings(config: Any, chosen: Selection, registry: Registry) -> dict[str, Any]:
    """The resolved config without the keys this run does not read: the built-in task's when both splits are files,
    other algorithms' sections, the sections of the backends and engines not chosen (their ``enabled`` kept: the
    selection read it), the environment's without one, LoRA's and the warm-up cache's when off."""
    settings = to_dict(config)
    if not config.data.task or (config.data.train_path and config.data.val_path):
        for key in ("task", "num_train", "num_val", "seed"):
            settings["data"].pop(key, None)
    picked = [chosen.algorithm, chosen.backend.chosen, *([chosen.engine.chosen] if chosen.engine else [])]
    chosen_keys = {spec.config_key for spec in picked}
    components = [*registry.specs(TrainingBackendSpec).values(), *registry.specs(RolloutEngineSpec).values()]
    for spec in [*components, *registry.specs(AlgorithmSpec).values()]:
        if not spec.config_key or spec.config_key in chosen_keys:
            continue
        *parents, last = spec.config_key.split(".")
        node = settings
        for part in parents:
            node = node.get(part, {})
        if last not in node:
            continue
        if spec in components:  # the selection read its `enabled`
            node[last] = {"enabled": node[last]["enabled"]}
        else:
            del node[last]
    if not config.environment.name:
        settings["environment"] = {"name": None}
    if not config.policy.lora.enabled:
        settings["policy"]["lora"] = {"enabled": False}
    if not config.warmup_recipe:
        settings.pop("warmup_cache", None)
    return settings


def cmd_certify(args: argparse.Namespace, registry: Registry) -> int:

    with tempfile.TemporaryDirectory(prefix="rl-core-certify-") as work:
        card = certify(
            args.name,
            registry,
            kind=args.kind,
            quick=args.quick,
            options=args.option,
            overrides=args.overrides,
            data=args.data,
            work=Path(work),
        )
    if args.json:
        sys.stdout.write(json.dumps(card.as_dict(), indent=2) + "\n")
    else:  # a report card piped to a file is not squeezed into 80 columns
        Console(width=None if console.is_terminal else 160).print(card.render())
    return 0 if card.passed else 1


def cmd_plot(args: argparse.Namespace, _registry: Registry) -> int:

    out = plot_run(Path(args.run_dir), Path(args.output) if args.output else None)
    console.print(f"wrote {out}")
    return 0


def cmd_config_reference(args: argparse.Namespace, registry: Registry) -> int:

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


RUN_EXAMPLES = """examples:
  rl-core run                                        the built-in default recipe (a tiny GRPO run on CPU)
  rl-core run examples/configs/grpo_calculator.yaml  a recipe; its first line is the command that runs it
  rl-core run my.yaml grpo.max_num_steps=100 policy.optimizer.lr=5e-4
                                                     overrides: dotted keys, YAML values
  rl-core run my.yaml 'reward.sources=[{name: math_verify}]' policy.backend=megatron
  rl-core run my.yaml --dry-run                      the resolved config, components, placement and data; no run
  rl-core run my.yaml run_dir=runs/second            another run folder (the same folder resumes, or says done)

every key: rl-core config-reference (docs/config-reference.md); what a config selects: rl-core plugins --explain"""


def _global_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    """--debug and --verbose, before the subcommand or after it (``default`` SUPPRESS on the subcommands, so that
    a flag given before is not reset by the subcommand's parser)."""
    parser.add_argument(
        "--debug", action="store_true", default=default, help="show tracebacks and debug logs; verify every refit"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=default,
        help="show the workers', vLLM's and Ray's output on the terminal too",
    )


def _add_eval(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "eval",
        parents=[common],
        help="score a finished run's model (or any model folder) on held-out prompts: mean reward, pass@k, maj@k",
        description="Generate k samples for each held-out prompt with any installed engine, score them with the "
        "run's reward sources (or environment), and write OUT/report.json and OUT/samples.jsonl (OUT: RUN/eval, or "
        "./eval for a model folder). With the defaults (one greedy sample, the run's seed and validation rows) it "
        "gives the run's last val/reward back.",
    )
    p.add_argument("target", help="a run folder (its config and final/ model) or a Hugging Face model folder")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (data, reward, engine, seed)")
    p.add_argument("-k", "--samples", type=int, default=1, help="samples per prompt (default 1)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: greedy for -k 1, else the run's)")
    p.add_argument("--max-rows", type=int, help="held-out rows (default: as many as the run validated on)")
    p.add_argument("--split", default="val", choices=["val", "train"])
    p.add_argument("--threshold", type=float, default=1.0, help="a sample is correct when reward >= this (1.0)")
    p.add_argument("-o", "--out", help="output folder")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=cmd_eval)


def cmd_eval(args: argparse.Namespace, registry: Registry) -> int:
    if args.samples < 1:
        raise InputError(f"--samples must be >= 1, not {args.samples}")
    out = eval_folder(Path(args.target).resolve(), Path(args.out).resolve() if args.out else None)
    settings = EvalSettings(
        k=args.samples,
        temperature=args.temperature,
        max_rows=args.max_rows,
        split=args.split,
        threshold=args.threshold,
        out=out,
    )
    run_console = RunConsole(console, progress=False, verbose=args.verbose)
    with run_logs(out, verbose=args.verbose or args.debug, packages=registry.packages()):
        report = run_eval(Path(args.target), list(args.overrides or []), settings, registry, run_console)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    table = Table("metric", "value", title=f"{report['model']} on {report['rows']} {report['split']} rows")
    for key, value in report.items():
        if isinstance(value, float):
            table.add_row(key, f"{value:.4f}")
    table.add_row("sampling", json.dumps(report["sampling"]))
    console.print(table)
    return 0


def _add_certify(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "certify",
        parents=[common],
        help="check a training backend, rollout engine, reward source, environment, algorithm or task for silent "
        "wrongness",
    )
    p.add_argument(
        "name", help="the component's registered name (rl-core plugins lists them); a task as data.task names it"
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides for the runs certify builds (a backend's, an engine's, an algorithm's)",
    )
    p.add_argument(
        "--kind",
        choices=sorted(KIND_FLAGS),
        help="when a name is registered as several",
    )
    p.add_argument("--quick", action="store_true", help="fewer refit routes and batch splits (under 2 minutes)")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the component's own config section (an engine's, a backend's, an algorithm's), a reward "
        "source's or environment's options, or a task's data.task_options",
    )
    p.add_argument("--data", type=Path, help="an environment's dataset rows (JSONL) to start episodes from")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_certify)


def build_parser(registry: Registry) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rl-core", description="RL post-training for language models.")
    _global_flags(parser, False)
    parser.add_argument("--version", action="store_true", help="print each package's version")
    common = argparse.ArgumentParser(add_help=False)
    _global_flags(common, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser(
        "run",
        parents=[common],
        help="run a config (no config: the built-in default recipe)",
        description="Run a config to the end: a warm-up if it names one, then the algorithm; a run folder that holds "
        "checkpoints resumes from the newest whole one, and one that finished says so.",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("items", nargs="*", metavar="[CONFIG] [dotted.key=value ...]")
    p.add_argument("--dry-run", action="store_true", help="show what would run (config, components, placement, data)")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("plugins", parents=[common], help="list plugins; --explain shows what a config selects")
    p.add_argument("--json", action="store_true")
    p.add_argument("--explain", nargs="*", metavar="[CONFIG] [dotted.key=value ...]")
    p.set_defaults(handler=cmd_plugins)

    _add_eval(sub, common)
    _add_certify(sub, common)

    p = sub.add_parser("plot", parents=[common], help="draw a run's reward, KL, loss and phase-time curves to a PNG")
    p.add_argument("run_dir")
    p.add_argument("-o", "--output", help="PNG path (default RUN_DIR/curves.png)")
    p.set_defaults(handler=cmd_plot)

    p = sub.add_parser(
        "config-reference", parents=[common], help="print the config reference (Markdown) from the attrs classes"
    )
    p.add_argument("-o", "--output")
    p.set_defaults(handler=cmd_config_reference)

    for name, spec in registry.specs(CliCommandSpec).items():
        p = sub.add_parser(name, parents=[common], help=spec.help)
        spec.configure(p)
        p.set_defaults(handler=lambda a, _r, spec=spec: spec.run(a))
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parse_args``, but ``key=value`` overrides may also follow a command's flags (``certify NAME --json a=b``)."""
    args, extra = parser.parse_known_args(argv)
    positional = "overrides" if hasattr(args, "overrides") else "items" if hasattr(args, "items") else None
    if extra and positional and all("=" in e and not e.startswith("-") for e in extra):
        setattr(args, positional, [*(getattr(args, positional) or []), *extra])
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("rl_core").setLevel(logging.DEBUG if debug else logging.INFO)
    # on the terminal: warnings and errors only (rl-core run keeps everything in RUN_DIR/logs/driver.log)
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.DEBUG if debug or "--verbose" in argv else logging.WARNING)
    try:
        # `rl-core plugins` lists plugins that clash (the advice other commands give for a clash) instead of failing
        command = next((a for a in argv if not a.startswith("-")), None)
        registry = Registry.discover(lenient=command == "plugins")
        parser = build_parser(registry)
        args = _parse(parser, argv)
        if args.version:
            print(versions(registry))
            return 0
        if not args.command:
            parser.print_help()
            return 0
        status = int(args.handler(args, registry) or 0)
        sys.stdout.flush()  # here, where a broken pipe is caught, not at exit
        return status
    except RLCoreError as exc:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/bold red]")
        return 130
    except BrokenPipeError:  # the reader went away (``rl-core plugins --json | head``): not an error
        _silence_stdout()
        return 0
    except Exception as exc:
        if debug:
            raise
        err_console.print(
            f"[bold red]error:[/bold red] {type(exc).__name__}: {escape(str(exc))}\n(run with --debug for the traceback)",
            highlight=False,
        )
        return 1


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so that Python's exit flush does not fail again."""

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
