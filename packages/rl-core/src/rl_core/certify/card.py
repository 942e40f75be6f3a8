"""The report card of one component, the bounds its checks are held to, and small helpers the checks share."""

from __future__ import annotations

import concurrent.futures
import math
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from rich.table import Table
from rich.text import Text

#: largest |engine or backend logprob - reference| on a sampled token, in fp32.
LOGPROB_BOUND = 1e-4
#: largest gradient (and loss) difference between splits of one batch, relative to the largest gradient, in fp32.
INVARIANCE_BOUND = 1e-6
#: config overrides that make a core-optimizer backend's step plain SGD with learning rate 1, unclipped.
SGD_OVERRIDES = ("policy.optimizer.name=sgd", "policy.optimizer.lr=1.0", "policy.max_grad_norm=null")
#: a refit must move the engine's logprobs at least this much (the new weights differ visibly).
REFIT_MOVES = 1e-2
#: the learning-rate schedule of the backend certify checks (its state must survive a checkpoint)
DECAYING_SCHEDULE = (
    "policy.scheduler.name=linear",
    # long enough that no step certify takes reaches the floor: every step's learning rate differs from the next's,
    # so a resumed step at the wrong point of the schedule shows
    "policy.scheduler.total_steps=100",
    "policy.scheduler.min_lr_ratio=0.1",
)
#: the longest a refit may take before certify calls it hung (a receiver that never joins a broadcast, say).
REFIT_TIMEOUT_S = 120.0
PROMPTS = ["Q: 3 + 4 = ? A:", "Sort the digits 9 1 4. Answer:", "Even or odd? 4 8 1 7", "the answer is"]

#: what a check returns: passed, the measurement, and optionally a detail.
Outcome = tuple[bool, str] | tuple[bool, str, str]


@attrs.frozen(kw_only=True)
class CheckResult:
    check: str
    passed: bool
    measured: str
    bound: str
    detail: str = ""
    #: not run, because the component declares it does not support what the check needs (``detail`` says what).
    skipped: bool = False


class Card:
    """The report card of one component: each check, pass or fail, the measured number and its bound."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind, self.name = kind, name
        self.results: list[CheckResult] = []
        self.started = time.monotonic()

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed or r.skipped for r in self.results)

    def failed(self) -> list[str]:
        return [r.check for r in self.results if not (r.passed or r.skipped)]

    def skip(self, check: str, why: str) -> None:
        """A check the component's declarations rule out: on the card as skipped, with the reason."""
        self.results.append(CheckResult(check=check, passed=False, measured="-", bound="", detail=why, skipped=True))

    def run(self, check: str, bound: str, fn: Callable[[], Outcome]) -> bool:
        """Run ``fn() -> (passed, measured[, detail])``; an exception fails the check with its message."""
        try:
            passed, measured, *rest = fn()
            detail = rest[0] if rest else ""
        except Exception as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            where = raised_in(exc)
            detail = f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300] + (
                f" (raised in {where})" if where else ""
            )
            passed, measured = False, "error"
        self.results.append(CheckResult(check=check, passed=passed, measured=measured, bound=bound, detail=detail))
        return passed

    def interrupted(self) -> None:
        """Ctrl-C: the card keeps what ran and says that later checks did not."""
        self.results.append(
            CheckResult(
                check="interrupted", passed=False, measured="Ctrl-C", bound="", detail="later checks did not run"
            )
        )

    def render(self) -> Any:

        ran = [r for r in self.results if not r.skipped]
        verdict = "passed" if self.passed else f"FAILED {len(self.failed())} of {len(ran)}"
        if len(ran) < len(self.results):
            verdict += f" ({len(self.results) - len(ran)} skipped)"
        table = Table(
            title=f"rl-core certify: {self.kind} {self.name!r}",
            title_justify="left",
            caption=f"{verdict}; the checks ran in {time.monotonic() - self.started:.0f} s",
            caption_justify="left",
        )
        for column in ("check", "result", "measured", "bound", "detail"):
            table.add_column(column, overflow="fold")
        for r in self.results:
            mark = (
                "[yellow]skip[/yellow]"
                if r.skipped
                else "[green]pass[/green]"
                if r.passed
                else "[bold red]FAIL[/bold red]"
            )
            # the checks' own text is data, not markup: rich would drop "[eos]" or "[1, 2]" as a tag
            table.add_row(Text(r.check), mark, *(Text(str(c)) for c in (r.measured, r.bound, r.detail)))
        return table

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "passed": self.passed,
            "checks": [attrs.asdict(r) for r in self.results],
        }


def raised_in(exc: BaseException) -> str:
    """The function rl-core called last on the way to ``exc`` (a plugin's method: ``module.Class.method``), when it
    is not rl-core's own; else ""."""
    core = Path(__file__).resolve().parents[1]
    frames = [frame for frame, _line in traceback.walk_tb(exc.__traceback__)]
    inside = [i for i, frame in enumerate(frames) if core in Path(frame.f_code.co_filename).resolve().parents]
    if not inside or inside[-1] + 1 >= len(frames):
        return ""
    callee = frames[inside[-1] + 1]
    return f"{callee.f_globals.get('__name__', '?')}.{callee.f_code.co_qualname}"


def bounded(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """``fn()`` in a thread, given at most ``seconds``: a call that hangs fails its check, naming ``what``, instead
    of holding certify until the transport's own timeout (the thread is left to finish or not)."""

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="certify")
    try:
        return pool.submit(fn).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"{what} did not finish within {seconds:g} s") from None
    finally:
        pool.shutdown(wait=False)


def gap(a: Any, b: Any, mask: Any) -> float:
    """The largest |a - b| where ``mask`` is set (inf where nothing is)."""
    keep = mask.bool()
    return float((a[keep] - b[keep]).abs().max()) if bool(keep.any()) else math.inf


def fmt(value: float) -> str:
    return f"{value:.2e}"
