"""Scorers that the server hosts and that also run in-process as reward sources: math answer checking
(``math-verify``) and a Hugging Face reward model (``AutoModelForSequenceClassification`` with one output)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from rl_core.api import InputError, check_reward_inputs


@attrs.frozen(kw_only=True)
class MathVerifyConfig:
    #: the data row's field holding the reference answer.
    answer_key: str = "answer"
    #: seconds allowed per parse/verify (enforced only on the main thread: math-verify uses signals).
    timeout_seconds: int = 5


@attrs.frozen(kw_only=True)
class MathVerifyScorer:
    """1.0 when the response's final answer is mathematically equal to ``metadata[answer_key]`` (``1/2``,
    ``0.5`` and ``\\frac{1}{2}`` are equal), else 0.0."""

    cfg: MathVerifyConfig = attrs.Factory(MathVerifyConfig)

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> list[float]:
        from math_verify import parse, verify

        check_reward_inputs(prompts, responses, metadata)
        timeout = self.cfg.timeout_seconds if threading.current_thread() is threading.main_thread() else None
        out = []
        for response, meta in zip(responses, metadata, strict=True):
            if self.cfg.answer_key not in meta:
                raise InputError(f"math_verify needs metadata[{self.cfg.answer_key!r}] for every sample")
            gold = parse(str(meta[self.cfg.answer_key]), parsing_timeout=timeout)
            answer = parse(response, parsing_timeout=timeout)
            out.append(float(bool(gold) and bool(answer) and verify(gold, answer, timeout_seconds=timeout)))
        return out

    def close(self) -> None:
        return None


@attrs.frozen(kw_only=True)
class RewardModelConfig:
    #: a local folder holding an AutoModelForSequenceClassification checkpoint with one output.
    path: str
    #: samples per forward pass of the reward model.
    inference_micro_batch_size: int = attrs.field(default=8, validator=attrs.validators.gt(0))
    #: tokens of prompt + response the reward model reads (longer inputs are truncated on the tokenizer's
    #: truncation side, usually the end).
    max_length: int = attrs.field(default=1024, validator=attrs.validators.gt(0))
    #: text between prompt and response when they are joined for the model.
    separator: str = ""
    #: data-parallel copies of the model; micro-batches are spread over them.
    replicas: int = attrs.field(default=1, validator=attrs.validators.gt(0))


class RewardModelScorer:
    """The reward model's single logit for ``prompt + separator + response``, in micro-batches of
    ``inference_micro_batch_size`` spread over ``replicas`` copies of the model (one thread each)."""

    def __init__(self, cfg: RewardModelConfig) -> None:
        import queue

        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not (Path(cfg.path) / "config.json").is_file():
            raise InputError(f"reward model folder {cfg.path!r} does not exist or has no config.json")
        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.path)
        models = [
            AutoModelForSequenceClassification.from_pretrained(cfg.path, dtype=torch.float32).eval()
            for _ in range(cfg.replicas)
        ]
        if models[0].config.num_labels != 1:
            raise InputError(f"reward model {cfg.path!r} has {models[0].config.num_labels} outputs; it must have 1")
        self.free: queue.Queue[Any] = queue.Queue()
        for model in models:
            self.free.put(model)

    def _micro_batch(self, texts: list[str]) -> list[float]:
        import torch

        model = self.free.get()  # a replica no other thread is using
        try:
            enc = self.tokenizer(
                texts, return_tensors="pt", padding=True, truncation=True, max_length=self.cfg.max_length
            )
            with torch.no_grad():
                return model(**enc).logits[:, 0].float().tolist()
        finally:
            self.free.put(model)

    def micro_batching(self) -> tuple[int, int]:
        """(inference_micro_batch_size, replicas): the run checks them against its rollout_micro_batch_size."""
        return self.cfg.inference_micro_batch_size, self.cfg.replicas

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> list[float]:
        from concurrent.futures import ThreadPoolExecutor

        check_reward_inputs(prompts, responses, metadata)
        texts = [p + self.cfg.separator + r for p, r in zip(prompts, responses, strict=True)]
        step = self.cfg.inference_micro_batch_size
        chunks = [texts[i : i + step] for i in range(0, len(texts), step)]
        if self.cfg.replicas == 1 or len(chunks) == 1:
            parts = [self._micro_batch(c) for c in chunks]
        else:
            with ThreadPoolExecutor(self.cfg.replicas) as pool:
                parts = list(pool.map(self._micro_batch, chunks))
        return [r for part in parts for r in part]

    def close(self) -> None:
        return None
