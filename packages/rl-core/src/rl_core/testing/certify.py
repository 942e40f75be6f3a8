"""``rl-core certify``: checks that catch silent wrongness in a training backend, a rollout engine or a reward
source, each reported with the number it measured and the bound it was held to.

The checks use tiny models built locally and a plain Hugging Face forward pass in this process as the reference.
They are functions of an already built component (``certify_engine``, ``certify_backend``,
``certify_reward_source``), so that a plugin's own tests can call them on instances they share; ``certify`` builds
the component from the registry, as the command does.

Numbers are held to fp32 bounds (the components run in float32 here): logprobs within ``LOGPROB_BOUND`` of the
reference, training invariant to the batch split within ``INVARIANCE_BOUND``, checkpoints bit-exact.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from rl_core.errors import InputError, PluginError

if TYPE_CHECKING:
    import torch

    from rl_core.batch import PolicyGradientBatch, TokenBatch
    from rl_core.protocols import RewardSource, Rollout, RolloutEngine, TrainingBackend
    from rl_core.registry import Registry

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
    "policy.scheduler.total_steps=4",
    "policy.scheduler.min_lr_ratio=0.1",
)
#: the longest a refit may take before certify calls it hung (a receiver that never joins a broadcast, say).
REFIT_TIMEOUT_S = 120.0


def _bounded(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """``fn()`` in a thread, given at most ``seconds``: a call that hangs fails its check, naming ``what``, instead
    of holding certify until the transport's own timeout (the thread is left to finish or not)."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="certify")
    try:
        return pool.submit(fn).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"{what} did not finish within {seconds:g} s") from None
    finally:
        pool.shutdown(wait=False)


PROMPTS = ["Q: 3 + 4 = ? A:", "Sort the digits 9 1 4. Answer:", "Even or odd? 4 8 1 7", "the answer is"]


@attrs.frozen(kw_only=True)
class CheckResult:
    check: str
    passed: bool
    measured: str
    bound: str
    detail: str = ""


class Card:
    """The report card of one component: each check, pass or fail, the measured number and its bound."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind, self.name = kind, name
        self.results: list[CheckResult] = []
        self.started = time.monotonic()

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    def failed(self) -> list[str]:
        return [r.check for r in self.results if not r.passed]

    def run(self, check: str, bound: str, fn: Callable[[], tuple[bool, str] | tuple[bool, str, str]]) -> bool:
        """Run ``fn() -> (passed, measured[, detail])``; an exception fails the check with its message."""
        try:
            passed, measured, *rest = fn()
            detail = rest[0] if rest else ""
        except Exception as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            passed, measured, detail = False, "error", f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]
        self.results.append(CheckResult(check=check, passed=passed, measured=measured, bound=bound, detail=detail))
        return passed

    def render(self) -> Any:
        from rich.table import Table

        verdict = "passed" if self.passed else f"FAILED {len(self.failed())} of {len(self.results)}"
        table = Table(
            title=f"rl-core certify: {self.kind} {self.name!r}",
            title_justify="left",
            caption=f"{verdict}; the checks ran in {time.monotonic() - self.started:.0f} s",
            caption_justify="left",
        )
        for column in ("check", "result", "measured", "bound", "detail"):
            table.add_column(column, overflow="fold")
        for r in self.results:
            mark = "[green]pass[/green]" if r.passed else "[bold red]FAIL[/bold red]"
            table.add_row(r.check, mark, r.measured, r.bound, r.detail)
        return table

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "passed": self.passed,
            "checks": [attrs.asdict(r) for r in self.results],
        }


def _gap(a: Any, b: Any, mask: Any) -> float:
    keep = mask.bool()
    return float((a[keep] - b[keep]).abs().max()) if bool(keep.any()) else math.inf


def _fmt(value: float) -> str:
    return f"{value:.2e}"


# ---------------------------------------------------------------------------------------------------------------
# Rollout engines
# ---------------------------------------------------------------------------------------------------------------


class _Reference:
    """A plain Hugging Face forward pass in this process (fp32), with the model's weights or perturbed ones."""

    def __init__(self, model_path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.original = {k: v.clone() for k, v in self.model.state_dict().items()}

    def perturbed(self, seed: int) -> dict[str, torch.Tensor]:
        import torch

        g = torch.Generator().manual_seed(seed)
        out = {}
        for k, v in self.original.items():
            # every tensor moves, constant ones too (norm weights of ones, biases of zeros): an engine that skips
            # some tensors on refit then generates with visibly different weights
            scale = float(v.float().std().nan_to_num(0.0)) if v.numel() > 1 else 0.0
            scale = scale or float(v.float().abs().mean()) or 0.02
            out[k] = v + 0.05 * scale * torch.randn(v.shape, generator=g)
        return out

    def logits(self, batch: TokenBatch) -> torch.Tensor:
        import torch

        with torch.no_grad():
            return self.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()

    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(dict(weights))

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        import torch

        from rl_core.batch import token_logprobs

        with torch.no_grad():
            logits = self.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return token_logprobs(logits, batch["input_ids"]) * batch["attention_mask"]


def _batch(rollouts: Sequence[Rollout], pad_id: int) -> PolicyGradientBatch:
    from rl_core.rollouts import rollout_batch

    return rollout_batch(rollouts, pad_id, 10_000)


def certify_engine(
    engine: RolloutEngine,
    model_path: Path,
    tokenizer: Any,
    *,
    routes: Sequence[str] = ("host_shm", "object_store", "broadcast"),
    quick: bool = False,
    card: Card | None = None,
) -> Card:
    """Certify a rollout engine that serves ``model_path`` (fp32). ``routes``: the refit routes to try (on GPU add
    ``cuda_ipc``); ``quick`` tries only the first."""
    from rl_core.protocols import RolloutEngine as Protocol
    from rl_core.protocols import SamplingParams
    from rl_core.refit import RefitRoute, RefitSender, checksums_match

    card = card or Card("rollout engine", type(engine).__name__)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    reference = _Reference(model_path)
    params = SamplingParams(n=3, max_new_tokens=8, temperature=1.0, seed=11)

    card.run(
        "implements the protocol",
        "RolloutEngine",
        lambda: (isinstance(engine, Protocol), "yes" if isinstance(engine, Protocol) else "missing methods"),
    )
    first = engine.generate(prompts, params)

    def shape() -> tuple[bool, str, str]:
        order = [(r.prompt_index, r.sample_index) for r in first]
        expected = [(i, j) for i in range(len(prompts)) for j in range(params.n)]
        problems = []
        if order != expected:
            problems.append("rollouts not ordered by (prompt, sample)")
        if any(tuple(r.prompt_token_ids) != tuple(prompts[r.prompt_index]) for r in first):
            problems.append("prompt_token_ids do not echo the prompts")
        if any(
            len(r.logprobs) != len(r.token_ids) or not 1 <= len(r.token_ids) <= params.max_new_tokens for r in first
        ):
            problems.append("one logprob per token, 1..max_new_tokens tokens")
        if any(not all(math.isfinite(x) and x <= 0 for x in r.logprobs) for r in first):
            problems.append("logprobs must be finite and <= 0")
        return not problems, f"{len(first)} rollouts", "; ".join(problems)

    card.run("rollouts: order, prompt ids, one logprob per token", f"{len(prompts)} x n={params.n}", shape)

    def logprob_check(temperature: float) -> Callable[[], tuple[bool, str]]:
        def check() -> tuple[bool, str]:
            p = attrs.evolve(params, temperature=temperature, seed=12)
            batch = _batch(engine.generate(prompts, p), pad)
            gap = _gap(batch["generation_logprobs"], reference.logprobs(batch), batch["loss_mask"])
            return gap <= LOGPROB_BOUND, _fmt(gap)

        return check

    bound = f"<= {LOGPROB_BOUND:.0e} vs an HF forward of the returned tokens"
    card.run("logprobs of sampled tokens (temperature 1)", bound, logprob_check(1.0))
    card.run("logprobs at temperature 0.7 are the policy's (raw logits)", bound, logprob_check(0.7))
    card.run("logprobs of greedy decoding", bound, logprob_check(0.0))

    def finish_reasons() -> tuple[bool, str, str]:
        stop_ids = {tokenizer.eos_token_id}
        wrong = [
            r
            for r in first
            if (r.finish_reason == "length")
            != (len(r.token_ids) == params.max_new_tokens and r.token_ids[-1] not in stop_ids)
        ]
        lengths = sum(r.finish_reason == "length" for r in first)
        return not wrong, f"{lengths} length / {len(first) - lengths} stop", f"{len(wrong)} wrong" if wrong else ""

    card.run("finish_reason is 'length' exactly when the budget ran out", "0 wrong", finish_reasons)

    def texts() -> tuple[bool, str]:
        wrong = sum(r.text != tokenizer.decode(list(r.token_ids), skip_special_tokens=True) for r in first)
        return wrong == 0, f"{wrong} differ"

    card.run("text is the decode of token_ids (no stop strings)", "0 differ", texts)

    def reproducible() -> tuple[bool, str]:
        again = engine.generate(prompts, params)
        same = sum(a.token_ids == b.token_ids for a, b in zip(first, again, strict=True))
        return same == len(first), f"{same}/{len(first)} equal"

    card.run("a seed reproduces the samples", "all equal", reproducible)

    def samples_differ() -> tuple[bool, str]:
        groups = [{r.token_ids for r in first if r.prompt_index == i} for i in range(len(prompts))]
        distinct = sum(len(g) > 1 for g in groups)
        return distinct > 0, f"{distinct}/{len(groups)} groups varied"

    card.run("the samples of a group are not copies", ">= 1 group varied", samples_differ)

    def stream() -> tuple[bool, str]:
        async def collect() -> list[Rollout]:
            return [r async for r in engine.stream(prompts, params)]

        got = sorted(asyncio.run(collect()), key=lambda r: (r.prompt_index, r.sample_index))
        same = sum(a == b for a, b in zip(got, first, strict=False))
        return len(got) == len(first) and same == len(first), f"{same}/{len(first)} equal"

    card.run("stream() yields what generate() returns", "all equal", stream)

    def sleep_wake() -> tuple[bool, str]:
        engine.sleep()
        engine.wake()
        again = engine.generate(prompts, params)
        same = sum(a.token_ids == b.token_ids for a, b in zip(first, again, strict=True))
        return same == len(first), f"{same}/{len(first)} equal"

    card.run("sleep() then wake() preserve the outputs", "all equal", sleep_wake)

    def bad_input() -> tuple[bool, str, str]:
        missed = []
        for what, bad in (("no prompts", []), ("an empty prompt", [[]]), ("an over-long prompt", [[5] * 100_000])):
            try:
                engine.generate(bad, params)
            except InputError:
                continue
            except Exception as exc:
                missed.append(f"{what}: {type(exc).__name__}")
                continue
            missed.append(f"{what}: no error")
        return not missed, f"{3 - len(missed)}/3 InputError", "; ".join(missed)

    card.run("bad input raises InputError", "3/3", bad_input)

    _stop_checks(engine, card, prompts, params, tokenizer)
    card.run(
        "an EOS ends the response, kept in token_ids and not in the text",
        "token_ids [eos], text ''",
        lambda: _eos_check(engine, prompts, params, tokenizer, reference),
    )
    _truncation_checks(engine, card, prompts, params, reference, pad)
    sender = RefitSender()
    receivers = tuple(engine.weight_receivers())
    for i, route in enumerate(routes[:1] if quick else routes):

        def refit(route: str = route, seed: int = i) -> tuple[bool, str, str]:
            new = reference.perturbed(seed)
            payload = sender.publish(new, RefitRoute(kind=route, receivers=receivers, verify=True))  # type: ignore[arg-type]
            stats = _bounded(lambda: engine.update_weights(payload), REFIT_TIMEOUT_S, f"the refit over {route}")
            sender.release()
            try:
                batch = _batch(engine.generate(prompts, attrs.evolve(params, seed=13 + seed)), pad)
                before = reference.logprobs(batch)
                reference.load(new)
                after = reference.logprobs(batch)
            finally:
                reference.load(reference.original)
            agree = _gap(batch["generation_logprobs"], after, batch["loss_mask"])
            moved = _gap(batch["generation_logprobs"], before, batch["loss_mask"])
            bad = checksums_match(payload.checksums or {}, stats.checksums)
            problems = [f"{len(bad)} tensors' checksums differ or were not reported"] if bad else []
            if agree > LOGPROB_BOUND:
                problems.append("logprobs do not match the new weights")
            if moved < REFIT_MOVES:
                problems.append("logprobs did not move from the old weights")
            return not problems, f"new {_fmt(agree)}, old {_fmt(moved)}", "; ".join(problems)

        card.run(
            f"refit over {route} loads the new weights",
            f"new <= {LOGPROB_BOUND:.0e}, old >= {REFIT_MOVES:.0e}, checksums equal",
            refit,
        )
    # back to the model's own weights, for whoever uses the engine next
    engine.update_weights(sender.publish(reference.original, RefitRoute(kind=routes[0], receivers=receivers)))  # type: ignore[arg-type]
    sender.close()
    return card


def _stop_checks(engine: RolloutEngine, card: Card, prompts: list[list[int]], params: Any, tokenizer: Any) -> None:
    """A stop string and a stop token taken from the engine's own greedy output, so that each certainly occurs:
    the response must end where it first occurs (the string cut from the text, the token kept)."""
    greedy = attrs.evolve(params, n=1, temperature=0.0, seed=None)
    free = engine.generate(prompts, greedy)

    def stop_string() -> tuple[bool, str, str]:
        cases = [(i, r.text[1:3]) for i, r in enumerate(free) if len(r.text.strip()) >= 3 and r.text[1:3].strip()]
        if not cases:
            return False, "no usable text", "greedy responses too short to take a stop string from"
        wrong = []
        for i, stop in cases:
            (out,) = engine.generate([prompts[i]], attrs.evolve(greedy, stop_strings=(stop,)))
            expected = free[i].text[: free[i].text.index(stop)]
            if out.finish_reason != "stop" or out.text != expected or stop in out.text:
                wrong.append(f"prompt {i}: {out.text!r} ({out.finish_reason}), expected {expected!r} (stop)")
        return not wrong, f"{len(cases) - len(wrong)}/{len(cases)} cut", "; ".join(wrong)[:300]

    def stop_token() -> tuple[bool, str, str]:
        wrong, tried = [], 0
        for i, r in enumerate(free):
            ids = list(r.token_ids)
            k = next((k for k in range(1, len(ids)) if ids[k] not in ids[:k]), None)
            if k is None:
                continue
            tried += 1
            (out,) = engine.generate([prompts[i]], attrs.evolve(greedy, stop_token_ids=(ids[k],)))
            text = tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
            if out.finish_reason != "stop" or list(out.token_ids) != ids[: k + 1] or out.text != text:
                wrong.append(f"prompt {i}: {len(out.token_ids)} tokens ({out.finish_reason}), expected {k + 1} (stop)")
        return bool(tried) and not wrong, f"{tried - len(wrong)}/{tried} stopped", "; ".join(wrong)[:300]

    card.run("a stop string ends the response where it first occurs (cut from the text)", "all cut", stop_string)
    card.run("a stop token ends the response where it first occurs (kept)", "all stopped", stop_token)


def _eos_check(
    engine: RolloutEngine, prompts: list[list[int]], params: Any, tokenizer: Any, reference: _Reference
) -> tuple[bool, str, str]:
    """EOS made certain: weights whose output rows of EOS and of the first greedy token are swapped make greedy
    decoding's first token EOS. The engine's own weights are put back afterwards."""
    from rl_core.refit import RefitRoute, RefitSender

    eos = tokenizer.eos_token_id
    head = "lm_head.weight"
    greedy = attrs.evolve(params, n=1, temperature=0.0, seed=None)
    (first,) = engine.generate(prompts[:1], greedy)
    if head not in reference.original or not first.token_ids or first.token_ids[0] == eos:
        return True, "not applicable", "no separate output layer, or EOS is already the first greedy token"
    token = first.token_ids[0]
    swapped = dict(reference.original)
    rows = swapped[head].clone()
    rows[[token, eos]] = rows[[eos, token]]
    swapped[head] = rows
    sender, receivers = RefitSender(), tuple(engine.weight_receivers())

    def load(weights: Mapping[str, torch.Tensor]) -> None:
        payload = sender.publish(weights, RefitRoute(kind="object_store", receivers=receivers))
        _bounded(lambda: engine.update_weights(payload), REFIT_TIMEOUT_S, "a refit over object_store")
        sender.release()

    try:
        load(swapped)
        (out,) = engine.generate(prompts[:1], greedy)
    finally:
        load(reference.original)
        sender.close()
    ok = list(out.token_ids) == [eos] and out.text == "" and out.finish_reason == "stop"
    return ok, f"token_ids {list(out.token_ids)[:4]}, text {out.text[:20]!r}", "" if ok else f"expected [{eos}], ''"


def _truncation_checks(
    engine: RolloutEngine, card: Card, prompts: list[list[int]], params: Any, reference: _Reference, pad: int
) -> None:
    """Every sampled token lies in the truncated distribution the sampling asked for, by the reference's logits at
    its position: greedy is the argmax, ``top_k`` the k most likely, ``top_p`` the smallest set reaching p."""
    import torch

    def inside(p: Any, allowed: Callable[[torch.Tensor, int], bool]) -> tuple[bool, str]:
        batch = _batch(engine.generate(prompts, p), pad)
        logits = reference.logits(batch)  # [B, T, V]
        mask = batch["loss_mask"].bool()
        outside = total = 0
        for b, t in mask.nonzero().tolist():
            total += 1
            outside += not allowed(logits[b, t - 1], int(batch["input_ids"][b, t]))
        return outside == 0 and total > 0, f"{outside}/{total} outside"

    def top_p_set(row: torch.Tensor, token: int, p: float = 0.5) -> bool:
        probs = torch.softmax(row, -1)
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]  # mass of the tokens ranked above each
        keep = order[before < p + 1e-4]
        return token in set(keep.tolist())

    card.run(
        "greedy decoding picks the most likely token",
        "0 outside",
        lambda: inside(
            attrs.evolve(params, temperature=0.0, seed=None, n=1),
            lambda row, tok: float(row[tok]) >= float(row.max()) - 1e-4,
        ),
    )
    card.run(
        "top_k = 3 samples only the 3 most likely tokens",
        "0 outside",
        lambda: inside(
            attrs.evolve(params, top_k=3, seed=21),
            lambda row, tok: float(row[tok]) >= float(row.topk(3).values[-1]) - 1e-4,
        ),
    )
    card.run(
        "top_p = 0.5 samples only the smallest set reaching half the mass",
        "0 outside",
        lambda: inside(attrs.evolve(params, top_p=0.5, seed=22), top_p_set),
    )


# ---------------------------------------------------------------------------------------------------------------
# Training backends
# ---------------------------------------------------------------------------------------------------------------


def _pg_batch(tokenizer: Any) -> PolicyGradientBatch:
    import torch

    from rl_core import batch as B
    from rl_core.testing.conformance import sample_batch

    batch = B.concat([sample_batch(tokenizer, response=r) for r in (" 7 and 8", " 12", " nine", " 1 2 3 4 5")])
    batch = B.select(batch, slice(0, 8))
    g = torch.Generator().manual_seed(0)
    advantages = torch.randn(8, 1, generator=g) * batch["loss_mask"]
    return {**batch, "advantages": advantages}


def _weights(backend: TrainingBackend) -> dict[str, torch.Tensor]:
    from rl_core.refit import RefitRoute, receive_weights

    return {k: v.clone() for k, v in receive_weights(backend.weights_for_refit(RefitRoute(kind="object_store")))}


def _max_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        return math.inf
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a) if a else math.inf


def certify_backend(
    make: Callable[[Sequence[str]], TrainingBackend],
    model_path: Path,
    tokenizer: Any,
    work: Path,
    *,
    variants: Mapping[str, Sequence[str]] | None = None,
    sgd: Sequence[str] = SGD_OVERRIDES,
    quick: bool = False,
    card: Card | None = None,
) -> Card:
    """Certify a training backend. ``make(overrides)`` builds one over ``model_path`` (fp32) with config
    overrides; ``variants`` maps a name to the overrides that split the same global batch another way (default:
    one row per micro-batch; unless ``quick``, two data-parallel ranks). ``sgd``: the overrides that make a step
    plain SGD with learning rate 1 and no clipping, so that a step's update is its gradient
    (``TrainingBackendSpec.sgd_overrides``)."""
    from rl_core.losses import ClippedPGLoss, NLLLoss
    from rl_core.schema import LossConfig
    from rl_core.testing.conformance import hf_logprobs, sample_batch

    card = card or Card("training backend", "?")
    if variants is None:
        variants = {"one row per micro-batch": ["policy.train_micro_batch_size=1"]}
        if not quick:
            variants = {**variants, "two data-parallel ranks": ["policy.num_workers=2"]}
    batch = _pg_batch(tokenizer)
    loss_fn = ClippedPGLoss(cfg=LossConfig())
    nll = sample_batch(tokenizer)
    # a decaying schedule: resumed steps equal uninterrupted ones only if the scheduler's state came back too
    base = make(list(DECAYING_SCHEDULE))
    try:
        from rl_core.protocols import TrainingBackend as Protocol

        card.run("implements the protocol", "TrainingBackend", lambda: (isinstance(base, Protocol), "yes"))
        before = base.logprobs(nll)

        def parity() -> tuple[bool, str]:
            gap = float((before - hf_logprobs(model_path, nll)).abs().max())
            return gap <= 1e-5, _fmt(gap)

        card.run("logprobs vs a plain HF forward", "<= 1e-05", parity)

        def padding() -> tuple[bool, str]:
            zero = bool((before[nll["attention_mask"] == 0] == 0).all()) and bool((before[:, 0] == 0).all())
            return zero, "0 on padding and position 0" if zero else "non-zero"

        card.run("logprobs are 0 on padding and at position 0", "exactly 0", padding)
        card.run(
            "reference logprobs equal the policy's before training",
            "<= 1e-05",
            lambda: (
                (g := float((base.reference_logprobs(nll) - before).abs().max())) <= 1e-5,
                _fmt(g),
            ),
        )
        initial = _weights(base)
        card.run(
            "weights_for_refit equals the model's parameters",
            "exactly equal",
            lambda: ((d := _max_diff(_common(initial, saved := _safetensors(model_path)), saved)) == 0.0, _fmt(d)),
        )
        work.mkdir(parents=True, exist_ok=True)
        base.save_checkpoint(work / "step0")
        metrics = base.train(batch, loss_fn)
        stepped = _weights(base)
        card.run(
            "a step changes the weights and reports a finite loss",
            "moved > 0, loss finite",
            lambda: (
                _max_diff(stepped, initial) > 0 and math.isfinite(metrics.get("loss", math.nan)),
                f"moved {_fmt(_max_diff(stepped, initial))}, loss {metrics.get('loss', math.nan):.4g}",
            ),
        )

        def likelihood() -> tuple[bool, str]:
            lp0 = base.logprobs(nll)
            base.train(nll, NLLLoss())
            lp1 = base.logprobs(nll)
            mask = nll["loss_mask"].bool()
            return float(lp1[mask].sum()) > float(
                lp0[mask].sum()
            ), f"{float(lp0[mask].sum()):.3f} -> {float(lp1[mask].sum()):.3f}"

        card.run("an NLL step raises the response's likelihood", "increases", likelihood)
        card.run(
            "the reference policy does not train",
            "<= 1e-05",
            lambda: (
                (g := float((base.reference_logprobs(nll) - before).abs().max())) <= 1e-5,
                _fmt(g),
            ),
        )

        def resume() -> tuple[bool, str]:
            # two steps after the save: the optimizer's state brings back the learning rate of the first, only the
            # scheduler's own state that of the second
            base.load_checkpoint(work / "step0")
            restored = _weights(base)
            base.train(batch, loss_fn)
            base.save_checkpoint(work / "step1")
            for _ in range(2):
                base.train(batch, loss_fn)
            straight = _weights(base)
            base.load_checkpoint(work / "step1")
            for _ in range(2):
                base.train(batch, loss_fn)
            resumed = _weights(base)
            d0, d1 = _max_diff(restored, initial), _max_diff(resumed, straight)
            return d0 == 0.0 and d1 == 0.0, f"load {_fmt(d0)}, resumed step {_fmt(d1)}"

        card.run("checkpoint load is bit-exact; resumed steps equal uninterrupted ones", "exactly 0", resume)

        def export() -> tuple[bool, str]:
            base.export_hf(work / "hf")
            exported = _safetensors(work / "hf")
            current = _weights(base)
            d = _max_diff(_common(current, exported), exported)
            gap = float((hf_logprobs(work / "hf", nll) - base.logprobs(nll)).abs().max())
            return d == 0.0 and gap <= 1e-5, f"weights {_fmt(d)}, logprobs {_fmt(gap)}"

        card.run("export_hf round-trips (weights and logprobs)", "weights 0, logprobs <= 1e-05", export)
    finally:
        base.shutdown()

    def gradient(overrides: Sequence[str]) -> tuple[dict[str, torch.Tensor], float]:
        """One SGD step (learning rate 1): the update is the gradient; and the step's loss."""
        backend = make([*sgd, *overrides])
        try:
            start = _weights(backend)
            loss = backend.train(batch, loss_fn)["loss"]
            return {k: start[k] - v for k, v in _weights(backend).items()}, loss
        finally:
            backend.shutdown()

    reference: list[tuple[dict[str, torch.Tensor], float]] = []
    for name, overrides in variants.items():

        def invariance(overrides: Sequence[str] = overrides) -> tuple[bool, str]:
            if not reference:
                reference.append(gradient([]))
            (grads, loss), (other, other_loss) = reference[0], gradient(overrides)
            scale = max(float(g.abs().max()) for g in grads.values())
            d = _max_diff(other, grads) / scale
            dl = abs(other_loss - loss) / max(abs(loss), 1e-12)
            return d <= INVARIANCE_BOUND and dl <= INVARIANCE_BOUND, f"gradient {_fmt(d)}, loss {_fmt(dl)}"

        card.run(
            f"loss and gradients are the same with {name}",
            f"<= {INVARIANCE_BOUND:.0e} (relative)",
            invariance,
        )

    def clipping() -> tuple[bool, str]:
        """With policy.max_grad_norm at half the gradient's global norm, the SGD update is the gradient scaled to
        that norm."""
        if not reference:
            reference.append(gradient([]))
        grads = reference[0][0]
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
        clipped, _loss = gradient([f"policy.max_grad_norm={norm / 2}"])
        d = _max_diff(clipped, {k: g * 0.5 for k, g in grads.items()}) / max(
            float(g.abs().max()) for g in grads.values()
        )
        return d <= 1e-5, f"update vs gradient x 0.5: {_fmt(d)}"

    card.run("gradient clipping follows policy.max_grad_norm", "<= 1e-05 (relative)", clipping)
    return card


def _common(weights: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` restricted to the names of ``like`` (a checkpoint file may leave out tied copies)."""
    return {k: v for k, v in weights.items() if k in like}


def _safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Reward sources
# ---------------------------------------------------------------------------------------------------------------


def reward_samples() -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """Prompts, responses (right and wrong) and metadata (``answer``) that every built-in source can score."""
    prompts, responses, metadata = [], [], []
    for a in range(6):
        for b in range(3):
            prompts.append(f"Q: {a} + {b} = ? A:")
            responses.append(f"{a + b + (b % 2)}")
            metadata.append({"answer": str(a + b)})
    return prompts, responses, metadata


def certify_reward_source(source: RewardSource, *, card: Card | None = None) -> Card:
    """Certify a reward source on ``reward_samples()``: values, order, batch-split invariance, concurrency and
    clear errors on bad input."""
    from rl_core.protocols import RewardSource as Protocol

    card = card or Card("reward source", type(source).__name__)
    prompts, responses, metadata = reward_samples()
    card.run("implements the protocol", "RewardSource", lambda: (isinstance(source, Protocol), "yes"))
    whole = list(source.score(prompts, responses, metadata))

    def totals(values: Sequence[Any]) -> list[float]:
        return [float(sum(v.values())) if isinstance(v, Mapping) else float(v) for v in values]

    def finite() -> tuple[bool, str]:
        ok = len(whole) == len(prompts) and all(math.isfinite(v) for v in totals(whole))
        return ok, f"{len(whole)} rewards for {len(prompts)}"

    card.run("one finite reward per response", f"{len(prompts)}", finite)

    def order() -> tuple[bool, str]:
        back = list(source.score(prompts[::-1], responses[::-1], metadata[::-1]))
        return totals(back) == totals(whole)[::-1], "reversed input, reversed rewards" if totals(back) == totals(whole)[
            ::-1
        ] else "differ"

    card.run("rewards follow the order of the inputs", "equal", order)

    def split() -> tuple[bool, str]:
        # uneven batches and one sample at a time: a reward that depends on the rest of its batch (a baseline, a
        # normalisation) changes with the batch's make-up
        cut = len(prompts) // 3 + 1
        parts = totals(source.score(prompts[:cut], responses[:cut], metadata[:cut]))
        parts += totals(source.score(prompts[cut:], responses[cut:], metadata[cut:]))
        alone = [totals(source.score([p], [r], [m]))[0] for p, r, m in zip(prompts, responses, metadata, strict=True)]
        d = max(abs(a - b) for got in (parts, alone) for a, b in zip(got, totals(whole), strict=True))
        return d <= 1e-5, _fmt(d)

    card.run("scoring in other batches (uneven, one at a time) gives the same rewards", "<= 1e-05", split)

    def concurrent() -> tuple[bool, str]:
        # each caller its own rotation of the samples: a source that mixes up concurrent requests answers one
        # caller with another's rewards
        def rotated(k: int) -> tuple[list[str], list[str], list[dict[str, Any]]]:
            return prompts[k:] + prompts[:k], responses[k:] + responses[:k], metadata[k:] + metadata[:k]

        shifts = [0, 1, 5, 7]
        with ThreadPoolExecutor(len(shifts)) as pool:
            results = list(pool.map(lambda k: totals(source.score(*rotated(k))), shifts))
        expected = totals(whole)
        d = max(
            abs(a - b)
            for k, got in zip(shifts, results, strict=True)
            for a, b in zip(got, expected[k:] + expected[:k], strict=True)
        )
        return d <= 1e-5, _fmt(d)

    card.run("4 concurrent callers get the rewards of their own inputs", "<= 1e-05", concurrent)

    def bad_input() -> tuple[bool, str, str]:
        try:
            source.score(prompts, responses[:-1], metadata)
        except InputError as exc:
            return True, type(exc).__name__, str(exc)[:120]
        except Exception as exc:
            return False, type(exc).__name__, f"expected an InputError naming the problem: {exc}"[:200]
        return False, "no error", "lists of different lengths were accepted"

    card.run("mismatched lengths raise a clear error", "InputError", bad_input)
    return card


# ---------------------------------------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------------------------------------


def certify_environment(
    env: Any, rows: Sequence[Mapping[str, Any]], actions: Sequence[str], *, card: Card | None = None
) -> Card:
    """Certify a multi-turn environment on dataset ``rows`` and model turns ``actions``: prompts are text, every
    turn answers a ``Transition`` with a finite reward, states pickle (steps may run in other processes), the same
    turn gives the same answer, and a row without the fields it needs is an ``InputError``."""
    import pickle

    from rl_core.protocols import Environment, Transition

    card = card or Card("environment", type(env).__name__)
    card.run("implements the protocol", "Environment", lambda: (isinstance(env, Environment), "yes"))
    starts = [env.reset(row) for row in rows]

    def prompts() -> tuple[bool, str]:
        ok = all(isinstance(p, str) and p for p, _s in starts)
        return ok, f"{len(starts)} prompts"

    card.run("reset() gives a non-empty prompt text", "all", prompts)

    def transitions() -> tuple[bool, str, str]:
        bad = []
        for (_p, state), action in zip(starts, actions, strict=False):
            t = env.step(state, action)
            if not isinstance(t, Transition) or not math.isfinite(t.reward) or not isinstance(t.observation, str):
                bad.append(repr(t)[:80])
        return not bad, f"{len(starts) - len(bad)}/{len(starts)}", "; ".join(bad[:2])

    card.run("step() answers a Transition with a finite reward", "all", transitions)

    def pickles() -> tuple[bool, str]:
        for (_p, state), action in zip(starts, actions, strict=False):
            again = pickle.loads(pickle.dumps(state))
            if env.step(again, action) != env.step(state, action):
                return False, "a state changed by pickling"
        return True, "states round-trip"

    card.run("states pickle and steps are deterministic", "equal", pickles)

    def bad_row() -> tuple[bool, str]:
        try:
            env.reset({})
        except InputError as exc:
            return True, f"InputError: {str(exc)[:60]}"
        except Exception as exc:
            return False, f"{type(exc).__name__}: expected an InputError naming the missing field"
        return True, "an empty row is accepted (nothing required)"

    card.run("a row without the fields it needs is an InputError", "InputError", bad_row)
    return card


# ---------------------------------------------------------------------------------------------------------------
# From the registry: what the command runs
# ---------------------------------------------------------------------------------------------------------------


def certify(
    name: str,
    registry: Registry,
    *,
    kind: str | None = None,
    quick: bool = False,
    options: Sequence[str] = (),
    data: Path | None = None,
    work: Path,
) -> Card:
    """Build the component ``name`` from the registry (a backend or engine over a tiny model, in fp32, on this
    machine's device; a reward source with ``options``, ``key=value`` each) and certify it."""
    wanted = {
        "backend": "training_backend",
        "engine": "rollout_engine",
        "reward": "reward_source",
        "environment": "environment",
    }
    kinds = [k for k in wanted.values() if name in registry.specs(k)]  # type: ignore[call-overload]
    if kind is not None:
        kinds = [k for k in kinds if k == wanted[kind]]
    if not kinds:
        raise PluginError(registry.why_missing("training_backend", name).replace("training backend", "component"))
    if len(kinds) > 1:
        raise PluginError(f"{name!r} is a {' and a '.join(kinds)}: say which with --kind")
    which = kinds[0]
    card = Card(which.replace("_", " "), name)
    try:
        if which == "reward_source":
            return certify_reward_source(_reward_source(name, registry, options), card=card)
        if which == "environment":
            return _certify_environment(name, registry, options, data, card)
        return _certify_ray_component(which, name, registry, quick=quick, work=work, card=card)
    except KeyboardInterrupt:  # Ctrl-C: the card so far, and what did not run
        card.results.append(
            CheckResult(
                check="interrupted", passed=False, measured="Ctrl-C", bound="", detail="later checks did not run"
            )
        )
        return card


def _certify_environment(name: str, registry: Registry, options: Sequence[str], data: Path | None, card: Card) -> Card:
    """On the first rows of ``data`` (JSONL), else of the built-in task of the same name, and a few plain turns."""
    from rl_core.data import TASKS, load_jsonl

    spec = registry.get("environment", name)
    env = spec.factory(_options(spec.config_class, name, options))
    if data is not None:
        rows = load_jsonl(data)[:8]
    elif name in TASKS:
        rows = TASKS[name](8, 0)
    else:
        raise InputError(f"give rows for environment {name!r} to start episodes from: --data ROWS.jsonl")
    actions = ["<calc>12+30</calc>", "<answer>42</answer>", "50", "7", "", "hello", "<calc>1*2-3</calc>", "99"]
    return certify_environment(env, rows, actions, card=card)


def _options(config_class: type | None, name: str, options: Sequence[str]) -> Any:
    import yaml

    from rl_core.config import structure_section

    given = {}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--option {item!r}: give key=value")
        given[key] = yaml.safe_load(value)
    return structure_section(config_class, given, name) if config_class else None


def _reward_source(name: str, registry: Registry, options: Sequence[str]) -> RewardSource:
    spec = registry.get("reward_source", name)
    return spec.factory(_options(spec.config_class, f"reward source {name}", options))


def _certify_ray_component(which: str, name: str, registry: Registry, *, quick: bool, work: Path, card: Card) -> Card:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from rl_core.cluster import init_ray
    from rl_core.config import load_config
    from rl_core.tiny_models import ensure_tiny_model

    hf_logging.disable_progress_bar()  # the reference forwards' "Loading weights" bars, above the report card
    model = ensure_tiny_model("qwen2-tiny")
    tokenizer = AutoTokenizer.from_pretrained(model)
    selector = "policy.backend" if which == "training_backend" else "policy.generation.backend"
    spec = registry.get(which, name)  # type: ignore[call-overload]
    section_key = spec.config_key

    def config(overrides: Sequence[str], run: str) -> Any:
        enable = [f"{section_key}.enabled=true"] if section_key else []
        return load_config(
            None,
            [
                f"run_dir={work / run}",
                "warmup_recipe=null",
                f"policy.model_name={model}",
                f"{selector}={name}",
                *enable,
                "policy.precision=float32",
                "policy.train_global_batch_size=8",
                "policy.train_micro_batch_size=4",
                "policy.logprob_batch_size=8",
                "policy.max_total_sequence_length=128",
                "policy.optimizer.lr=1e-3",
                *overrides,
            ],
            registry,
        )

    init_ray(config([], "probe").cluster, verbose=False)
    if which == "rollout_engine":
        cfg = config([], "engine")
        engine = spec.factory(cfg, cfg.sections.get(section_key or ""))
        try:
            return certify_engine(engine, model, tokenizer, quick=quick, card=card)
        finally:
            engine.shutdown()
    runs = iter(range(100))

    def make(overrides: Sequence[str]) -> TrainingBackend:
        cfg = config(overrides, f"backend-{next(runs)}")
        backend: TrainingBackend = spec.factory(cfg, cfg.sections.get(section_key or ""))
        return backend

    variants = None
    section = config([], "probe").sections.get(section_key or "")
    if not quick and section is not None and hasattr(section, "sequence_packing"):
        variants = {
            "one row per micro-batch": ["policy.train_micro_batch_size=1"],
            "two data-parallel ranks": ["policy.num_workers=2"],
            "sequence packing": [f"{section_key}.sequence_packing=true"],
        }
    return certify_backend(
        make,
        model,
        tokenizer,
        work / "checkpoints",
        variants=variants,
        sgd=spec.sgd_overrides,
        quick=quick,
        card=card,
    )
