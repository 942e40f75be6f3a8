"""Rollout engines with planted bugs, each wrapping a real engine and breaking one thing the field gets wrong most
(trainer/inference logprob mismatch, silently failed weight sync, ...): ``rl-core certify`` must fail every one."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs

from rl_core.contracts.protocols import Rollout, SamplingParams
from rl_core.contracts.refit import BroadcastWeights, RefitPayload, RefitStats


class Passthrough:
    """The real engine, unchanged: each mutant overrides one method."""

    def __init__(self, inner: Any, tokenizer: Any) -> None:
        from pathlib import Path

        self.inner, self.tokenizer = inner, tokenizer
        self.model_path = Path(tokenizer.name_or_path)

    def mutate(self, rollouts: list[Rollout], sampling: SamplingParams) -> list[Rollout]:
        return rollouts

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Rollout]:
        return self.mutate(self.inner.generate(prompts, sampling), sampling)

    async def stream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> AsyncIterator[Rollout]:
        for r in self.generate(prompts, sampling):
            yield r

    def update_weights(self, payload: RefitPayload) -> RefitStats:
        return self.inner.update_weights(payload)

    def weight_receivers(self) -> Sequence[str]:
        return self.inner.weight_receivers()

    def sleep(self) -> None:
        self.inner.sleep()

    def wake(self) -> None:
        self.inner.wake()

    def shutdown(self) -> None:
        return None  # the wrapped engine is shared


def _each(rollouts: list[Rollout], **change: Any) -> list[Rollout]:
    return [attrs.evolve(r, **{k: v(r) for k, v in change.items()}) for r in rollouts]


class ShiftedLogprobs(Passthrough):
    def mutate(self, rollouts, sampling):
        return _each(rollouts, logprobs=lambda r: (*r.logprobs[1:], r.logprobs[-1]))


class ScaledLogprobs(Passthrough):
    def mutate(self, rollouts, sampling):
        return _each(rollouts, logprobs=lambda r: tuple(1.7 * x for x in r.logprobs))


class ZeroLogprobs(Passthrough):
    def mutate(self, rollouts, sampling):
        return _each(rollouts, logprobs=lambda r: tuple(0.0 for _ in r.logprobs))


class TemperedLogprobs(Passthrough):
    """Logprobs of the tempered distribution instead of the policy's (roughly: scaled by 1 / T)."""

    def mutate(self, rollouts, sampling):
        t = sampling.temperature
        return rollouts if t in (0.0, 1.0) else _each(rollouts, logprobs=lambda r: tuple(x / t for x in r.logprobs))


class NoopRefit(Passthrough):
    def update_weights(self, payload):
        return RefitStats(num_bytes=1, num_tensors=1, seconds=0.0, route=payload.kind)


class BroadcastNoop(Passthrough):
    """Receives over every route but the broadcast, where it answers at once without joining the group: the sender
    waits for a receiver that never comes. Not in ``MUTANTS``: ``--quick`` tries only the first route."""

    def update_weights(self, payload):
        if isinstance(payload, BroadcastWeights):
            return RefitStats(num_bytes=1, num_tensors=1, seconds=0.0, route="broadcast")
        return super().update_weights(payload)


class AlwaysStop(Passthrough):
    def mutate(self, rollouts, sampling):
        return _each(rollouts, finish_reason=lambda r: "stop")


class RaisingStream(Passthrough):
    async def stream(self, prompts, sampling):
        raise RuntimeError("stream is broken")
        yield  # pragma: no cover - makes this an async generator


class EosInText(Passthrough):
    def mutate(self, rollouts, sampling):
        return _each(rollouts, text=lambda r: r.text + self.tokenizer.eos_token)


class NoPromptIds(Passthrough):
    def mutate(self, rollouts, sampling):
        return _each(rollouts, prompt_token_ids=lambda r: ())


class SeedIgnored(Passthrough):
    def generate(self, prompts, sampling):
        return self.inner.generate(prompts, attrs.evolve(sampling, seed=random.randrange(2**31)))


class CopiedSamples(Passthrough):
    """Every sample of a group the same (the classic n-children-share-one-seed bug)."""

    def mutate(self, rollouts, sampling):
        first = {r.prompt_index: r for r in rollouts if r.sample_index == 0}
        return [attrs.evolve(first[r.prompt_index], sample_index=r.sample_index) for r in rollouts]


class EmptyForEmpty(Passthrough):
    def generate(self, prompts, sampling):
        return [] if not prompts else super().generate(prompts, sampling)


class NoSleepWake:
    """No sleep() or wake() at all."""

    def __init__(self, inner: Any, tokenizer: Any) -> None:
        self.inner = inner

    def generate(self, prompts, sampling):
        return self.inner.generate(prompts, sampling)

    async def stream(self, prompts, sampling):
        async for r in self.inner.stream(prompts, sampling):
            yield r

    def update_weights(self, payload):
        return self.inner.update_weights(payload)

    def weight_receivers(self):
        return self.inner.weight_receivers()

    def shutdown(self):
        return None


class EosTextKept(Passthrough):
    """Decodes with the special tokens: a response that ends with EOS keeps its text (as an engine that forgets
    skip_special_tokens does); nothing shows until EOS is actually generated."""

    def mutate(self, rollouts, sampling):
        eos = self.tokenizer.eos_token_id
        return _each(rollouts, text=lambda r: r.text + self.tokenizer.eos_token if eos in r.token_ids else r.text)


class IgnoresTruncation(Passthrough):
    """Samples from the whole distribution whatever top_k / top_p say."""

    def generate(self, prompts, sampling):
        return self.inner.generate(prompts, attrs.evolve(sampling, top_k=-1, top_p=1.0))


class IgnoresStopStrings(Passthrough):
    """Generates past its stop strings (and keeps them in the text)."""

    def generate(self, prompts, sampling):
        return self.inner.generate(prompts, attrs.evolve(sampling, stop_strings=()))


class IgnoresStopTokens(Passthrough):
    def generate(self, prompts, sampling):
        return self.inner.generate(prompts, attrs.evolve(sampling, stop_token_ids=()))


class SkipsBiases(Passthrough):
    """A refit that loads every tensor but the biases, and reports the checksums of what it was sent: only what the
    engine then generates with can tell."""

    def update_weights(self, payload):
        from safetensors.torch import load_file

        from rl_core.contracts.refit import RefitRoute, RefitSender, receive_weights

        first = load_file(str(self.model_path / "model.safetensors"))
        sent = dict(receive_weights(payload))
        kept = {k: (first[k] if k.endswith(".bias") else v) for k, v in sent.items()}
        sender = RefitSender()
        try:
            route = RefitRoute(kind="object_store", receivers=tuple(self.inner.weight_receivers()))
            stats = self.inner.update_weights(sender.publish(kept, route))
        finally:
            sender.close()
        return attrs.evolve(stats, checksums=payload.checksums)


#: mutant -> a check of the report card that must fail for it
MUTANTS = {
    ShiftedLogprobs: "logprobs of sampled tokens (temperature 1)",
    ScaledLogprobs: "logprobs of sampled tokens (temperature 1)",
    ZeroLogprobs: "logprobs of sampled tokens (temperature 1)",
    TemperedLogprobs: "logprobs at temperature 0.7 are the policy's (raw logits)",
    NoopRefit: "refit over host_shm loads the new weights",
    AlwaysStop: "finish_reason is 'length' exactly when the budget ran out",
    RaisingStream: "stream() yields what generate() returns",
    EosInText: "text is the decode of token_ids (no stop strings)",
    NoPromptIds: "rollouts: order, prompt ids, one logprob per token",
    SeedIgnored: "a seed reproduces the samples",
    CopiedSamples: "the samples of a group are not copies",
    EmptyForEmpty: "bad input raises InputError",
    NoSleepWake: "implements the protocol",
    IgnoresTruncation: "top_k = 3 samples only the 3 most likely tokens",
    IgnoresStopStrings: "a stop string ends the response where it first occurs (cut from the text)",
    IgnoresStopTokens: "a stop token ends the response where it first occurs (kept)",
    SkipsBiases: "refit over host_shm loads the new weights",
    EosTextKept: "an EOS ends the response, kept in token_ids and not in the text",
}
