"""Certifying a reward source (values, order, batch-split invariance, concurrency, bad input) and a multi-turn
environment (prompts, transitions, pickled states, bad rows)."""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from rl_core.base.errors import InputError
from rl_core.certify.card import Card, Outcome, fmt
from rl_core.contracts.protocols import Environment, Transition
from rl_core.contracts.protocols import RewardSource as Protocol

if TYPE_CHECKING:
    from rl_core.contracts.protocols import RewardSource

Samples = tuple[list[str], list[str], list[dict[str, Any]]]


def reward_samples() -> Samples:
    """Prompts, responses (right and wrong) and metadata (``answer``) that every built-in source can score."""
    prompts, responses, metadata = [], [], []
    for a in range(6):
        for b in range(3):
            prompts.append(f"Q: {a} + {b} = ? A:")
            responses.append(f"{a + b + (b % 2)}")
            metadata.append({"answer": str(a + b)})
    return prompts, responses, metadata


def totals(values: Sequence[Any]) -> list[float]:
    """Each reward as one number (a dict of named parts summed)."""
    return [float(sum(v.values())) if isinstance(v, Mapping) else float(v) for v in values]


def certify_reward_source(source: RewardSource, *, card: Card | None = None, samples: Samples | None = None) -> Card:
    """Certify a reward source on ``samples`` (prompts, responses, metadata; default ``reward_samples()``): values,
    order, batch-split invariance, concurrency and clear errors on bad input."""

    card = card or Card("reward source", type(source).__name__)
    samples = samples or reward_samples()
    card.run("implements the protocol", "RewardSource", lambda: (isinstance(source, Protocol), "yes"))
    whole: list[float] = []  # the rewards of the whole batch, which the later checks compare against

    def first() -> Outcome:
        whole.extend(totals(source.score(*samples)))
        return check_finite(samples, whole)

    card.run("one finite reward per response", f"{len(samples[0])}", first)
    card.run("rewards follow the order of the inputs", "equal", partial(check_order, source, samples, whole))
    card.run(
        "scoring in other batches (uneven, one at a time) gives the same rewards",
        "<= 1e-05",
        partial(check_split, source, samples, whole),
    )
    card.run(
        "4 concurrent callers get the rewards of their own inputs",
        "<= 1e-05",
        partial(check_concurrent, source, samples, whole),
    )
    card.run("mismatched lengths raise a clear error", "InputError", partial(check_mismatched, source, samples))
    return card


def check_finite(samples: Samples, whole: list[float]) -> Outcome:
    ok = len(whole) == len(samples[0]) and all(math.isfinite(v) for v in whole)
    return ok, f"{len(whole)} rewards for {len(samples[0])}"


def check_order(source: RewardSource, samples: Samples, whole: list[float]) -> Outcome:
    prompts, responses, metadata = samples
    back = totals(source.score(prompts[::-1], responses[::-1], metadata[::-1]))
    same = back == whole[::-1]
    return same, "reversed input, reversed rewards" if same else "differ"


def check_split(source: RewardSource, samples: Samples, whole: list[float]) -> Outcome:
    """Uneven batches and one sample at a time: a reward that depends on the rest of its batch (a baseline, a
    normalisation) changes with the batch's make-up."""
    prompts, responses, metadata = samples
    cut = len(prompts) // 3 + 1
    parts = totals(source.score(prompts[:cut], responses[:cut], metadata[:cut]))
    parts += totals(source.score(prompts[cut:], responses[cut:], metadata[cut:]))
    alone = [totals(source.score([p], [r], [m]))[0] for p, r, m in zip(prompts, responses, metadata, strict=True)]
    d = max(abs(a - b) for got in (parts, alone) for a, b in zip(got, whole, strict=True))
    return d <= 1e-5, fmt(d)


def check_concurrent(source: RewardSource, samples: Samples, whole: list[float]) -> Outcome:
    """Each caller its own rotation of the samples: a source that mixes up concurrent requests answers one caller
    with another's rewards."""

    def rotated(k: int) -> Samples:
        prompts, responses, metadata = samples
        return prompts[k:] + prompts[:k], responses[k:] + responses[:k], metadata[k:] + metadata[:k]

    shifts = [0, 1, 5, 7]
    with ThreadPoolExecutor(len(shifts)) as pool:
        results = list(pool.map(lambda k: totals(source.score(*rotated(k))), shifts))
    d = max(
        abs(a - b)
        for k, got in zip(shifts, results, strict=True)
        for a, b in zip(got, whole[k:] + whole[:k], strict=True)
    )
    return d <= 1e-5, fmt(d)


def check_mismatched(source: RewardSource, samples: Samples) -> Outcome:
    prompts, responses, metadata = samples
    try:
        source.score(prompts, responses[:-1], metadata)
    except InputError as exc:
        return True, type(exc).__name__, str(exc)[:120]
    except Exception as exc:
        return False, type(exc).__name__, f"expected an InputError naming the problem: {exc}"[:200]
    return False, "no error", "lists of different lengths were accepted"


def certify_environment(
    env: Any, rows: Sequence[Mapping[str, Any]], actions: Sequence[str], *, card: Card | None = None
) -> Card:
    """Certify a multi-turn environment on dataset ``rows`` and model turns ``actions``: prompts are text, every
    turn answers a ``Transition`` with a finite reward, states pickle (steps may run in other processes), the same
    turn gives the same answer, and a row without the fields it needs is an ``InputError``."""

    card = card or Card("environment", type(env).__name__)
    card.run("implements the protocol", "Environment", lambda: (isinstance(env, Environment), "yes"))
    starts = [env.reset(row) for row in rows]
    card.run(
        "reset() gives a non-empty prompt text",
        "all",
        lambda: (all(isinstance(p, str) and p for p, _s in starts), f"{len(starts)} prompts"),
    )
    card.run(
        "step() answers a Transition with a finite reward", "all", partial(check_transitions, env, starts, actions)
    )
    card.run("states pickle and steps are deterministic", "equal", partial(check_pickles, env, starts, actions))
    card.run("a row without the fields it needs is an InputError", "InputError", partial(check_bad_row, env))
    return card


def check_transitions(env: Any, starts: Sequence[tuple[str, Any]], actions: Sequence[str]) -> Outcome:

    bad = []
    for (_p, state), action in zip(starts, actions, strict=False):
        t = env.step(state, action)
        if not isinstance(t, Transition) or not math.isfinite(t.reward) or not isinstance(t.observation, str):
            bad.append(repr(t)[:80])
    return not bad, f"{len(starts) - len(bad)}/{len(starts)}", "; ".join(bad[:2])


def check_pickles(env: Any, starts: Sequence[tuple[str, Any]], actions: Sequence[str]) -> Outcome:

    for (_p, state), action in zip(starts, actions, strict=False):
        again = pickle.loads(pickle.dumps(state))
        if env.step(again, action) != env.step(state, action):
            return False, "a state changed by pickling"
    return True, "states round-trip"


def check_bad_row(env: Any) -> Outcome:
    try:
        env.reset({})
    except InputError as exc:
        return True, f"InputError: {str(exc)[:60]}"
    except Exception as exc:
        return False, f"{type(exc).__name__}: expected an InputError naming the missing field"
    return True, "an empty row is accepted (nothing required)"
