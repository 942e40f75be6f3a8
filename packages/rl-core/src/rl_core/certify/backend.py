"""Certifying a training backend: logprobs against a plain Hugging Face forward, the reference policy, refit
weights, a step that learns, bit-exact checkpoints with a decaying schedule, the export, loss and gradients the same
however one batch is split, and gradient clipping."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from rl_core.base.schema import LossConfig
from rl_core.certify.card import DECAYING_SCHEDULE, INVARIANCE_BOUND, SGD_OVERRIDES, Card, Outcome, fmt, gap
from rl_core.certify.conformance import hf_logprobs, sample_batch
from rl_core.certify.starts import AheadStarts
from rl_core.contracts import batch as B
from rl_core.contracts.protocols import TrainingBackend
from rl_core.contracts.refit import RefitRoute, receive_weights
from rl_core.training.losses import ClippedPGLoss, NLLLoss

if TYPE_CHECKING:
    import torch

    from rl_core.contracts.batch import PolicyGradientBatch, TokenBatch
    from rl_core.contracts.protocols import LossFunction, TrainingBackend

Weights = dict[str, "torch.Tensor"]


@attrs.define
class BackendCase:
    """The backend under test (built with a decaying schedule) and what its checks share."""

    backend: TrainingBackend
    model_path: Path
    work: Path
    batch: PolicyGradientBatch
    nll: TokenBatch
    loss_fn: LossFunction[Any]
    before: torch.Tensor
    initial: Weights

    def weights(self) -> Weights:
        return weights_of(self.backend)


@attrs.define
class Gradients:
    """SGD steps at learning rate 1 on fresh backends: the update is the gradient. The unsplit one is kept."""

    make: Callable[[Sequence[str]], TrainingBackend]
    sgd: Sequence[str]
    batch: PolicyGradientBatch
    loss_fn: LossFunction[Any]
    _plain: tuple[Weights, float] | None = None
    #: what the backends reported of their start-up checks of their shortcuts (``shortcut/NAME/...`` metrics)
    shortcuts: dict[str, float] = attrs.Factory(dict)

    def step(self, overrides: Sequence[str]) -> tuple[Weights, float]:
        """The update of the trained parameters (with LoRA the adapters', in which the update is the gradient; the
        merged weights move by a product of them) and the step's loss."""
        backend = self.make([*self.sgd, *overrides])
        try:
            start = weights_of(backend, trained=True)
            metrics = backend.train(self.batch, self.loss_fn)
            self.shortcuts.update({k: v for k, v in metrics.items() if k.startswith("shortcut/")})
            return {k: start[k] - v for k, v in weights_of(backend, trained=True).items()}, metrics["loss"]
        finally:
            backend.shutdown()

    @property
    def plain(self) -> tuple[Weights, float]:
        if self._plain is None:
            self._plain = self.step([])
        return self._plain


def certify_backend(
    make: Callable[[Sequence[str]], TrainingBackend],
    model_path: Path,
    tokenizer: Any,
    work: Path,
    *,
    variants: Mapping[str, Sequence[str]] | None = None,
    sgd: Sequence[str] = SGD_OVERRIDES,
    max_ranks: int | None = None,
    quick: bool = False,
    only: Collection[str] | None = None,
    card: Card | None = None,
    starts_at_once: int = 1,
) -> Card:
    """Certify a training backend. ``make(overrides)`` builds one over ``model_path`` (fp32) with config
    overrides; ``variants`` maps a name to the overrides that split the same global batch another way (default:
    one row per micro-batch; unless ``quick``, two data-parallel ranks). ``sgd``: the overrides that make a step
    plain SGD with learning rate 1 and no clipping, so that a step's update is its gradient
    (``TrainingBackendSpec.sgd_overrides``). A variant needing more ranks than ``max_ranks``
    (``TrainingBackendSpec.max_ranks``) is skipped, and the card says why. ``only``: the checks to run, by name;
    the others' backends never start. The checks on one backend (``SINGLE_BACKEND_CHECKS``) each build on the
    state the one before leaves: asking for any of them runs them all. ``starts_at_once`` > 1: the backends start
    that many at a time ahead of their checks (``AheadStarts``: on CPU, where each start is mostly one core importing
    torch; ``make`` must then build independent backends)."""

    card = card or Card("training backend", "?")
    if variants is None:
        variants = {"one row per micro-batch": ["policy.train_micro_batch_size=1"]}
        if not quick:
            variants = {**variants, "two data-parallel ranks": ["policy.num_workers=2"]}
    checks = {name for name, _bound, _check in SINGLE_BACKEND_CHECKS}
    gradient_checks = {f"loss and gradients are the same with {name}": o for name, o in variants.items()}
    _refuse_unknown(only, checks | gradient_checks.keys() | {CLIPPING})

    def wanted(check: str) -> bool:
        return only is None or check in only

    compared = {c: o for c, o in gradient_checks.items() if wanted(c) and (max_ranks is None or _ranks(o) <= max_ranks)}
    single = any(map(wanted, checks))
    planned = [list(DECAYING_SCHEDULE)] if single else []
    if compared or wanted(CLIPPING):
        planned += [[*sgd], *([*sgd, *o] for o in compared.values())]  # the clipping step's norm is the plain one's
    starts = AheadStarts(make, planned, starts_at_once)
    batch, loss_fn, nll = _pg_batch(tokenizer), ClippedPGLoss(cfg=LossConfig()), sample_batch(tokenizer)
    grads = Gradients(make=starts, sgd=sgd, batch=batch, loss_fn=loss_fn)
    try:
        if single:
            _single_backend_checks(starts, model_path, work, batch, loss_fn, nll, card)
        bound = f"<= {INVARIANCE_BOUND:.0e} (relative)"
        for check, overrides in gradient_checks.items():
            if check in compared:
                card.run(check, bound, partial(check_invariance, grads, overrides))
            elif wanted(check):
                card.skip(check, f"needs {_ranks(overrides)} ranks; the backend declares max_ranks={max_ranks}")
        if wanted(CLIPPING):
            card.run(CLIPPING, "<= 1e-05 (relative)", partial(check_clipping, grads))
    finally:
        starts.close()
    report_shortcuts(grads.shortcuts, card)
    return card


def _refuse_unknown(only: Collection[str] | None, known: Collection[str]) -> None:
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise ValueError(f"no backend check named {', '.join(map(repr, unknown))}; the checks: {sorted(known)}")


def _ranks(overrides: Sequence[str]) -> int:
    """The data-parallel ranks a variant's overrides ask for."""
    return max((int(o.partition("=")[2]) for o in overrides if o.startswith("policy.num_workers=")), default=1)


def report_shortcuts(metrics: Mapping[str, float], card: Card) -> None:
    """One line per shortcut a backend checked at start-up against whole rows (``shortcut/NAME/on``, its gaps): on
    (exact on this model) or off for the run. Either is correct behaviour; the line says which, and by how much."""
    names = sorted({k.split("/")[1] for k in metrics if k.startswith("shortcut/") and k.endswith("/on")})
    for name in names:
        on = metrics[f"shortcut/{name}/on"] == 1.0
        gaps = ", ".join(
            f"{kind} {metrics[f'shortcut/{name}/{kind}_gap']:.1e}"
            for kind in ("logprob", "grad")
            if f"shortcut/{name}/{kind}_gap" in metrics
        )
        seen = f"{'on' if on else 'off for the run'}: {gaps}"
        card.run(f"start-up check of shortcut {name} against whole rows", "exact, or off", partial(_shown, seen))


def _shown(seen: str) -> tuple[bool, str]:
    """A start-up check's outcome as certify shows it: passed either way (off is correct), its line says which."""
    return True, seen


def _single_backend_checks(
    make: Callable[[Sequence[str]], TrainingBackend],
    model_path: Path,
    work: Path,
    batch: PolicyGradientBatch,
    loss_fn: LossFunction[Any],
    nll: TokenBatch,
    card: Card,
) -> None:
    """``SINGLE_BACKEND_CHECKS`` in order, on one backend with a decaying schedule (resumed steps equal
    uninterrupted ones only if the scheduler's state came back too), saved at step 0 before any check."""
    backend = make(list(DECAYING_SCHEDULE))
    try:
        before = backend.logprobs(nll)
        case = BackendCase(
            backend=backend,
            model_path=model_path,
            work=work,
            batch=batch,
            nll=nll,
            loss_fn=loss_fn,
            before=before,
            initial=weights_of(backend),
        )
        work.mkdir(parents=True, exist_ok=True)
        backend.save_checkpoint(work / "step0")
        for name, bound, check in SINGLE_BACKEND_CHECKS:
            card.run(name, bound, partial(check, case))
    finally:
        backend.shutdown()


def check_protocol(case: BackendCase) -> Outcome:

    return isinstance(case.backend, TrainingBackend), "yes"


def check_parity(case: BackendCase) -> Outcome:

    g = gap(case.before, hf_logprobs(case.model_path, case.nll), case.nll["loss_mask"])
    return g <= 1e-5, fmt(g)


def check_padding(case: BackendCase) -> Outcome:
    before = case.before
    zero = bool((before[case.nll["attention_mask"] == 0] == 0).all()) and bool((before[:, 0] == 0).all())
    return zero, "0 on padding and position 0" if zero else "non-zero"


def check_reference(case: BackendCase) -> Outcome:
    """The reference policy's logprobs are the initial policy's (before training, and after it)."""
    g = gap(case.backend.reference_logprobs(case.nll), case.before, case.nll["loss_mask"])
    return g <= 1e-5, fmt(g)


def check_refit_weights(case: BackendCase) -> Outcome:
    saved = safetensors_in(case.model_path)
    d = max_diff(common(case.initial, saved), saved)
    return d == 0.0, fmt(d)


def check_step(case: BackendCase) -> Outcome:
    metrics = case.backend.train(case.batch, case.loss_fn)
    moved, loss = max_diff(case.weights(), case.initial), metrics.get("loss", math.nan)
    return moved > 0 and math.isfinite(loss), f"moved {fmt(moved)}, loss {loss:.4g}"


def check_likelihood(case: BackendCase) -> Outcome:

    nll, backend = case.nll, case.backend
    mask = nll["loss_mask"].bool()
    lp0 = float(backend.logprobs(nll)[mask].sum())
    backend.train(nll, NLLLoss())
    lp1 = float(backend.logprobs(nll)[mask].sum())
    return lp1 > lp0, f"{lp0:.3f} -> {lp1:.3f}"


def check_resume(case: BackendCase) -> Outcome:
    """Two steps after the save: the optimizer's state brings back the learning rate of the first, only the
    scheduler's own state that of the second."""
    backend, work = case.backend, case.work
    backend.load_checkpoint(work / "step0")
    restored = case.weights()
    backend.train(case.batch, case.loss_fn)
    backend.save_checkpoint(work / "step1")
    for _ in range(2):
        backend.train(case.batch, case.loss_fn)
    straight = case.weights()
    backend.load_checkpoint(work / "step1")
    for _ in range(2):
        backend.train(case.batch, case.loss_fn)
    d0, d1 = max_diff(restored, case.initial), max_diff(case.weights(), straight)
    return d0 == 0.0 and d1 == 0.0, f"load {fmt(d0)}, resumed step {fmt(d1)}"


def check_export(case: BackendCase) -> Outcome:

    case.backend.export_hf(case.work / "hf")
    exported = safetensors_in(case.work / "hf")
    d = max_diff(common(case.weights(), exported), exported)
    g = gap(hf_logprobs(case.work / "hf", case.nll), case.backend.logprobs(case.nll), case.nll["loss_mask"])
    return d == 0.0 and g <= 1e-5, f"weights {fmt(d)}, logprobs {fmt(g)}"


#: the checks on one backend, in the order they run (each after the state the ones before leave).
SINGLE_BACKEND_CHECKS: tuple[tuple[str, str, Callable[[BackendCase], Outcome]], ...] = (
    ("implements the protocol", "TrainingBackend", check_protocol),
    ("logprobs vs a plain HF forward", "<= 1e-05", check_parity),
    ("logprobs are 0 on padding and at position 0", "exactly 0", check_padding),
    ("reference logprobs equal the policy's before training", "<= 1e-05", check_reference),
    ("weights_for_refit equals the model's parameters", "exactly equal", check_refit_weights),
    ("a step changes the weights and reports a finite loss", "moved > 0, loss finite", check_step),
    ("an NLL step raises the response's likelihood", "increases", check_likelihood),
    ("the reference policy does not train", "<= 1e-05", check_reference),
    ("checkpoint load is bit-exact; resumed steps equal uninterrupted ones", "exactly 0", check_resume),
    ("export_hf round-trips (weights and logprobs)", "weights 0, logprobs <= 1e-05", check_export),
)
CLIPPING = "gradient clipping follows policy.max_grad_norm"


def check_invariance(grads: Gradients, overrides: Sequence[str]) -> Outcome:
    (plain, loss), (other, other_loss) = grads.plain, grads.step(overrides)
    scale = largest(plain)
    if scale == 0.0:
        return False, STILL
    d = max_diff(other, plain) / scale
    dl = abs(other_loss - loss) / max(abs(loss), 1e-12)
    return d <= INVARIANCE_BOUND and dl <= INVARIANCE_BOUND, f"gradient {fmt(d)}, loss {fmt(dl)}"


def check_clipping(grads: Gradients) -> Outcome:
    """With policy.max_grad_norm at half the gradient's global norm, the SGD update is the gradient scaled to that
    norm."""
    plain = grads.plain[0]
    if largest(plain) == 0.0:
        return False, STILL
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in plain.values()))
    clipped, _loss = grads.step([f"policy.max_grad_norm={norm / 2}"])
    d = max_diff(clipped, {k: g * 0.5 for k, g in plain.items()}) / largest(plain)
    return d <= 1e-5, f"update vs gradient x 0.5: {fmt(d)}"


#: a gradient check's result when the plain SGD step moved nothing (there is no scale to compare against)
STILL = "the plain SGD step moved no weight (every update is 0): the backend does not train"


def largest(update: Mapping[str, torch.Tensor]) -> float:
    """The largest absolute entry of an update (its scale)."""
    return max((float(g.abs().max()) for g in update.values()), default=0.0)


def _pg_batch(tokenizer: Any) -> PolicyGradientBatch:
    import torch

    batch = B.concat([sample_batch(tokenizer, response=r) for r in (" 7 and 8", " 12", " nine", " 1 2 3 4 5")])
    batch = B.select(batch, slice(0, 8))
    g = torch.Generator().manual_seed(0)
    advantages = torch.randn(8, 1, generator=g) * batch["loss_mask"]
    return {**batch, "advantages": advantages}


def weights_of(backend: TrainingBackend, *, trained: bool = False) -> Weights:
    """The weights a refit sends (``trained``: only the trained ones, the adapters of a LoRA backend)."""
    route = RefitRoute(kind="object_store", adapters_only=trained)
    return {k: v.clone() for k, v in receive_weights(backend.weights_for_refit(route))}


def max_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        return math.inf
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a) if a else math.inf


def common(weights: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor]) -> Weights:
    """``weights`` restricted to the names of ``like`` (a checkpoint file may leave out tied copies)."""
    return {k: v for k, v in weights.items() if k in like}


def safetensors_in(folder: Path) -> Weights:
    from safetensors.torch import load_file

    out: Weights = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out
