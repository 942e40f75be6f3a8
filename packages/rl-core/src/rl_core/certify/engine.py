"""Certifying a rollout engine: rollouts' shape, logprobs against a plain Hugging Face forward, finish reasons and
stops, sampling truncation, seeds, streaming, sleep/wake, bad input, and refits over each route, each verified by
what the engine then generates with."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from rl_core.base.errors import InputError
from rl_core.certify.card import (
    LOGPROB_BOUND,
    PROMPTS,
    REFIT_MOVES,
    REFIT_TIMEOUT_S,
    Card,
    Outcome,
    bounded,
    fmt,
    gap,
)
from rl_core.contracts import lora
from rl_core.contracts.protocols import RolloutEngine, SamplingParams
from rl_core.contracts.refit import RefitRoute, RefitSender, checksums_match
from rl_core.contracts.tokens import token_logprobs
from rl_core.training.rollouts import rollout_batch

if TYPE_CHECKING:
    import torch

    from rl_core.base.schema import LoraConfig
    from rl_core.contracts.batch import PolicyGradientBatch, TokenBatch
    from rl_core.contracts.protocols import Rollout


class Reference:
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

        return token_logprobs(self.logits(batch), batch["input_ids"]) * batch["attention_mask"]


@attrs.define
class EngineCase:
    """The engine under test and what its checks share: the prompts, the sampling, the first rollouts."""

    engine: RolloutEngine
    tokenizer: Any
    reference: Reference
    prompts: list[list[int]]
    pad: int
    params: SamplingParams
    #: the refit route of the checks that only need some route (the first the engine declares)
    route: str
    #: the longest a refit may take, the engine's loading and the sender's broadcast each
    timeout: float = REFIT_TIMEOUT_S
    first: list[Rollout] = attrs.Factory(list)

    @property
    def greedy(self) -> SamplingParams:
        return attrs.evolve(self.params, n=1, temperature=0.0, seed=None)

    def batch(self, params: SamplingParams, prompts: Sequence[list[int]] | None = None) -> PolicyGradientBatch:

        return rollout_batch(self.engine.generate(list(prompts or self.prompts), params), self.pad, 10_000)

    def load(self, sender: RefitSender, weights: Mapping[str, torch.Tensor], route: str = "object_store") -> Any:
        """Refit ``weights`` over ``route`` (verified), bounded in time; the engine's stats."""

        receivers = tuple(self.engine.weight_receivers())
        payload = sender.publish(weights, RefitRoute(kind=route, receivers=receivers, verify=True))  # type: ignore[arg-type]
        try:
            stats = bounded(lambda: self.engine.update_weights(payload), self.timeout, f"the refit over {route}")
        finally:
            sender.release(timeout=self.timeout)
        return payload, stats


def certify_engine(
    engine: RolloutEngine,
    model_path: Path,
    tokenizer: Any,
    *,
    routes: Sequence[str] = ("host_shm", "object_store", "broadcast"),
    declared: Sequence[str] | None = None,
    quick: bool = False,
    refit_timeout_s: float = REFIT_TIMEOUT_S,
    adapters: LoraConfig | None = None,
    card: Card | None = None,
) -> Card:
    """Certify a rollout engine that serves ``model_path`` (fp32). ``routes``: the refit routes to try (on GPU add
    ``cuda_ipc``), those of them the engine ``declared`` (``RolloutEngineSpec.refit_routes``; None: all); ``quick``
    tries only the first. A refit that takes longer than ``refit_timeout_s`` fails its check, naming the route.
    ``adapters``: the LoRA config of an engine that takes adapter-only refits (``takes_adapters``): checked too."""

    card = card or Card("rollout engine", type(engine).__name__)
    tried = [r for r in routes if declared is None or r in declared]
    case = EngineCase(
        engine=engine,
        tokenizer=tokenizer,
        reference=Reference(model_path),
        prompts=[tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS],
        pad=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        params=SamplingParams(n=3, max_new_tokens=8, temperature=1.0, seed=11),
        route=tried[0] if tried else "object_store",
        timeout=refit_timeout_s,
    )
    card.run("implements the protocol", "RolloutEngine", partial(check_protocol, case))
    case.first = engine.generate(case.prompts, case.params)
    n = f"{len(case.prompts)} x n={case.params.n}"
    card.run("rollouts: order, prompt ids, one logprob per token", n, partial(check_shape, case))
    bound = f"<= {LOGPROB_BOUND:.0e} vs an HF forward of the returned tokens"
    card.run("logprobs of sampled tokens (temperature 1)", bound, partial(check_logprobs, case, 1.0))
    card.run("logprobs at temperature 0.7 are the policy's (raw logits)", bound, partial(check_logprobs, case, 0.7))
    card.run("logprobs of greedy decoding", bound, partial(check_logprobs, case, 0.0))
    card.run("finish_reason is 'length' exactly when the budget ran out", "0 wrong", partial(check_finish, case))
    card.run("text is the decode of token_ids (no stop strings)", "0 differ", partial(check_texts, case))
    card.run("a seed reproduces the samples", "all equal", partial(check_reproducible, case))
    card.run("the samples of a group are not copies", ">= 1 group varied", partial(check_samples_differ, case))
    card.run("stream() yields what generate() returns", "all equal", partial(check_stream, case))
    card.run("sleep() then wake() preserve the outputs", "all equal", partial(check_sleep_wake, case))
    card.run("bad input raises InputError", "3/3", partial(check_bad_input, case))
    check_stops(case, card)
    sender = RefitSender()
    try:
        eos = "token_ids [eos], text ''"
        card.run(
            "an EOS ends the response, kept in token_ids and not in the text", eos, partial(check_eos, case, sender)
        )
        check_truncation(case, card)
        check_refits(case, card, sender, routes, tried, quick)
        if adapters is not None:
            check_adapter_refits(case, card, sender, adapters, model_path)
    finally:
        # back to the model's own weights, for whoever uses the engine next
        case.load(sender, case.reference.original)
        sender.close()
    return card


def check_protocol(case: EngineCase) -> Outcome:

    ok = isinstance(case.engine, RolloutEngine)
    return ok, "yes" if ok else "missing methods"


def check_shape(case: EngineCase) -> Outcome:
    first, params = case.first, case.params
    order = [(r.prompt_index, r.sample_index) for r in first]
    expected = [(i, j) for i in range(len(case.prompts)) for j in range(params.n)]
    problems = []
    if order != expected:
        problems.append("rollouts not ordered by (prompt, sample)")
    if any(tuple(r.prompt_token_ids) != tuple(case.prompts[r.prompt_index]) for r in first):
        problems.append("prompt_token_ids do not echo the prompts")
    if any(len(r.logprobs) != len(r.token_ids) or not 1 <= len(r.token_ids) <= params.max_new_tokens for r in first):
        problems.append("one logprob per token, 1..max_new_tokens tokens")
    if any(not all(math.isfinite(x) and x <= 0 for x in r.logprobs) for r in first):
        problems.append("logprobs must be finite and <= 0")
    return not problems, f"{len(first)} rollouts", "; ".join(problems)


def check_logprobs(case: EngineCase, temperature: float) -> Outcome:
    batch = case.batch(attrs.evolve(case.params, temperature=temperature, seed=12))
    g = gap(batch["generation_logprobs"], case.reference.logprobs(batch), batch["loss_mask"])
    return g <= LOGPROB_BOUND, fmt(g)


def check_finish(case: EngineCase) -> Outcome:
    stop_ids = {case.tokenizer.eos_token_id}
    budget = case.params.max_new_tokens
    wrong = [
        r
        for r in case.first
        if (r.finish_reason == "length") != (len(r.token_ids) == budget and r.token_ids[-1] not in stop_ids)
    ]
    lengths = sum(r.finish_reason == "length" for r in case.first)
    return not wrong, f"{lengths} length / {len(case.first) - lengths} stop", f"{len(wrong)} wrong" if wrong else ""


def check_texts(case: EngineCase) -> Outcome:
    decode = case.tokenizer.decode
    wrong = sum(r.text != decode(list(r.token_ids), skip_special_tokens=True) for r in case.first)
    return wrong == 0, f"{wrong} differ"


def _same_tokens(case: EngineCase, again: Sequence[Rollout]) -> Outcome:
    same = sum(a.token_ids == b.token_ids for a, b in zip(case.first, again, strict=True))
    return same == len(case.first), f"{same}/{len(case.first)} equal"


def check_reproducible(case: EngineCase) -> Outcome:
    return _same_tokens(case, case.engine.generate(case.prompts, case.params))


def check_samples_differ(case: EngineCase) -> Outcome:
    groups = [{r.token_ids for r in case.first if r.prompt_index == i} for i in range(len(case.prompts))]
    distinct = sum(len(g) > 1 for g in groups)
    return distinct > 0, f"{distinct}/{len(groups)} groups varied"


def check_stream(case: EngineCase) -> Outcome:
    async def collect() -> list[Rollout]:
        return [r async for r in case.engine.stream(case.prompts, case.params)]

    got = sorted(asyncio.run(collect()), key=lambda r: (r.prompt_index, r.sample_index))
    same = sum(a == b for a, b in zip(got, case.first, strict=False))
    return len(got) == len(case.first) and same == len(case.first), f"{same}/{len(case.first)} equal"


def check_sleep_wake(case: EngineCase) -> Outcome:
    case.engine.sleep()
    case.engine.wake()
    return _same_tokens(case, case.engine.generate(case.prompts, case.params))


def check_bad_input(case: EngineCase) -> Outcome:
    missed = []
    for what, bad in (("no prompts", []), ("an empty prompt", [[]]), ("an over-long prompt", [[5] * 100_000])):
        try:
            case.engine.generate(bad, case.params)
        except InputError:
            continue
        except Exception as exc:
            missed.append(f"{what}: {type(exc).__name__}")
            continue
        missed.append(f"{what}: no error")
    return not missed, f"{3 - len(missed)}/3 InputError", "; ".join(missed)


def check_stops(case: EngineCase, card: Card) -> None:
    """A stop string and a stop token taken from the engine's own greedy output, so that each certainly occurs."""
    free = case.engine.generate(case.prompts, case.greedy)
    card.run(
        "a stop string ends the response where it first occurs (cut from the text)",
        "all cut",
        partial(check_stop_string, case, free),
    )
    card.run(
        "a stop token ends the response where it first occurs (kept)",
        "all stopped",
        partial(check_stop_token, case, free),
    )


def check_stop_string(case: EngineCase, free: Sequence[Rollout]) -> Outcome:
    """A stop string taken from the engine's own greedy output (so that it certainly occurs) must end the response
    where it first occurs, cut from the text."""
    cases = [(i, r.text[1:3]) for i, r in enumerate(free) if len(r.text.strip()) >= 3 and r.text[1:3].strip()]
    if not cases:
        return False, "no usable text", "greedy responses too short to take a stop string from"
    wrong = []
    for i, stop in cases:
        (out,) = case.engine.generate([case.prompts[i]], attrs.evolve(case.greedy, stop_strings=(stop,)))
        expected = free[i].text[: free[i].text.index(stop)]
        if out.finish_reason != "stop" or out.text != expected or stop in out.text:
            wrong.append(f"prompt {i}: {out.text!r} ({out.finish_reason}), expected {expected!r} (stop)")
    return not wrong, f"{len(cases) - len(wrong)}/{len(cases)} cut", "; ".join(wrong)[:300]


def check_stop_token(case: EngineCase, free: Sequence[Rollout]) -> Outcome:
    """A stop token taken from the greedy output ends the response where it first occurs, and is kept."""
    wrong, tried = [], 0
    for i, r in enumerate(free):
        ids = list(r.token_ids)
        k = next((k for k in range(1, len(ids)) if ids[k] not in ids[:k]), None)
        if k is None:
            continue
        tried += 1
        (out,) = case.engine.generate([case.prompts[i]], attrs.evolve(case.greedy, stop_token_ids=(ids[k],)))
        text = case.tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
        if out.finish_reason != "stop" or list(out.token_ids) != ids[: k + 1] or out.text != text:
            wrong.append(f"prompt {i}: {len(out.token_ids)} tokens ({out.finish_reason}), expected {k + 1} (stop)")
    return bool(tried) and not wrong, f"{tried - len(wrong)}/{tried} stopped", "; ".join(wrong)[:300]


def check_eos(case: EngineCase, sender: RefitSender) -> Outcome:
    """EOS made certain: weights whose output rows of EOS and of the first greedy token are swapped make greedy
    decoding's first token EOS. The engine's own weights are put back afterwards."""
    eos, head, original = case.tokenizer.eos_token_id, "lm_head.weight", case.reference.original
    (first,) = case.engine.generate(case.prompts[:1], case.greedy)
    if head not in original or not first.token_ids or first.token_ids[0] == eos:
        return True, "not applicable", "no separate output layer, or EOS is already the first greedy token"
    token = first.token_ids[0]
    rows = original[head].clone()
    rows[[token, eos]] = rows[[eos, token]]
    try:
        case.load(sender, {**original, head: rows})
        (out,) = case.engine.generate(case.prompts[:1], case.greedy)
    finally:
        case.load(sender, original)
    ok = list(out.token_ids) == [eos] and out.text == "" and out.finish_reason == "stop"
    return ok, f"token_ids {list(out.token_ids)[:4]}, text {out.text[:20]!r}", "" if ok else f"expected [{eos}], ''"


def check_truncation(case: EngineCase, card: Card) -> None:
    """Every sampled token lies in the truncated distribution the sampling asked for, by the reference's logits at
    its position: greedy is the argmax, ``top_k`` the k most likely, ``top_p`` the smallest set reaching p."""
    card.run(
        "greedy decoding picks the most likely token",
        "0 outside",
        partial(_inside, case, case.greedy, lambda row, tok: float(row[tok]) >= float(row.max()) - 1e-4),
    )
    card.run(
        "top_k = 3 samples only the 3 most likely tokens",
        "0 outside",
        partial(
            _inside,
            case,
            attrs.evolve(case.params, top_k=3, seed=21),
            lambda row, tok: float(row[tok]) >= float(row.topk(3).values[-1]) - 1e-4,
        ),
    )
    card.run(
        "top_p = 0.5 samples only the smallest set reaching half the mass",
        "0 outside",
        partial(_inside, case, attrs.evolve(case.params, top_p=0.5, seed=22), _in_top_p),
    )


def _inside(case: EngineCase, params: SamplingParams, allowed: Callable[[torch.Tensor, int], bool]) -> Outcome:
    batch = case.batch(params)
    logits = case.reference.logits(batch)  # [B, T, V]
    outside = total = 0
    for b, t in batch["loss_mask"].bool().nonzero().tolist():
        total += 1
        outside += not allowed(logits[b, t - 1], int(batch["input_ids"][b, t]))
    return outside == 0 and total > 0, f"{outside}/{total} outside"


def _in_top_p(row: torch.Tensor, token: int, p: float = 0.5) -> bool:
    import torch

    probs = torch.softmax(row, -1)
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(0) - probs[order]  # mass of the tokens ranked above each
    return token in set(order[before < p + 1e-4].tolist())


def check_refits(
    case: EngineCase, card: Card, sender: RefitSender, routes: Sequence[str], declared: Sequence[str], quick: bool
) -> None:
    """A refit over each of the ``routes`` the engine ``declared`` (``quick``: the first); the others are on the card
    as skipped."""
    moves = f"new <= {LOGPROB_BOUND:.0e}, old >= {REFIT_MOVES:.0e}, checksums equal"
    for i, route in enumerate(declared[:1] if quick else declared):
        card.run(f"refit over {route} loads the new weights", moves, partial(check_refit, case, sender, route, i))
    for route in (r for r in routes if r not in declared):
        card.skip(f"refit over {route} loads the new weights", "the engine does not declare this route (refit_routes)")


def check_adapter_refits(case: EngineCase, card: Card, sender: RefitSender, cfg: LoraConfig, model_path: Path) -> None:
    """Adapter-only refits (an engine with ``takes_adapters``): random adapters move only their own bytes and the
    engine then samples the adapted policy; zero adapters (LoRA off) give the base model's logprobs back."""
    adapted: dict[str, Any] = {}
    bound = f"adapters' bytes only; adapted <= {LOGPROB_BOUND:.0e}, base >= {REFIT_MOVES:.0e}"
    card.run(
        "an adapter-only refit moves the adapters alone and takes effect",
        bound,
        partial(check_adapters_on, case, sender, cfg, model_path, adapted),
    )
    card.run(
        "zero adapters give the base model's logprobs",
        f"<= {LOGPROB_BOUND:.0e}",
        partial(check_adapters_off, case, sender, adapted),
    )


def check_adapters_on(
    case: EngineCase, sender: RefitSender, cfg: LoraConfig, model_path: Path, adapted: dict[str, Any]
) -> Outcome:
    """Random adapters (seeded) on a ``peft`` copy of the model, sent alone: the engine samples that model."""
    import torch
    from transformers import AutoModelForCausalLM

    model = lora.wrap(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32), cfg, trainable=False)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if lora.is_adapter(name):
                param.copy_(0.05 * torch.randn(param.shape, generator=g))
    tensors = {n: p.detach().clone() for n, p in model.named_parameters() if lora.is_adapter(n)}
    adapted["tensors"] = tensors
    case.load(sender, case.reference.original)  # the base again (a refit check left other weights behind)
    size = sum(p.numel() * p.element_size() for p in tensors.values())
    _payload, stats = case.load(sender, tensors)
    batch = case.batch(attrs.evolve(case.params, seed=31))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    mine = token_logprobs(logits, batch["input_ids"]) * batch["attention_mask"]
    agree = gap(batch["generation_logprobs"], mine, batch["loss_mask"])
    moved = gap(batch["generation_logprobs"], case.reference.logprobs(batch), batch["loss_mask"])
    ok = agree <= LOGPROB_BOUND and moved >= REFIT_MOVES and stats.num_bytes == size
    return ok, f"{stats.num_bytes} bytes, adapted {fmt(agree)}, base {fmt(moved)}", f"the adapters: {size} bytes"


def check_adapters_off(case: EngineCase, sender: RefitSender, adapted: dict[str, Any]) -> Outcome:
    import torch

    case.load(sender, {n: torch.zeros_like(t) for n, t in adapted["tensors"].items()})
    batch = case.batch(attrs.evolve(case.params, seed=32))
    base = gap(batch["generation_logprobs"], case.reference.logprobs(batch), batch["loss_mask"])
    return base <= LOGPROB_BOUND, fmt(base)


def check_refit(case: EngineCase, sender: RefitSender, route: str, seed: int) -> Outcome:
    """Perturbed weights (every tensor moves) over ``route``: the checksums the engine reports match, and what it
    generates next has the new weights' logprobs, not the old ones'."""

    reference = case.reference
    new = reference.perturbed(seed)
    payload, stats = case.load(sender, new, route)
    try:
        batch = case.batch(attrs.evolve(case.params, seed=13 + seed))
        before = reference.logprobs(batch)
        reference.load(new)
        after = reference.logprobs(batch)
    finally:
        reference.load(reference.original)
    agree = gap(batch["generation_logprobs"], after, batch["loss_mask"])
    moved = gap(batch["generation_logprobs"], before, batch["loss_mask"])
    bad = checksums_match(payload.checksums or {}, stats.checksums)
    problems = [f"{len(bad)} tensors' checksums differ or were not reported"] if bad else []
    if agree > LOGPROB_BOUND:
        problems.append("logprobs do not match the new weights")
    if moved < REFIT_MOVES:
        problems.append("logprobs did not move from the old weights")
    return not problems, f"new {fmt(agree)}, old {fmt(moved)}", "; ".join(problems)
