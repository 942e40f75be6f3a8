"""One Hugging Face ``generate`` replica, run inside a Ray actor.

A call's prompts are expanded to ``n`` sequences each, sorted by prompt length and cut into buckets of
``max_batch_size`` (left-padded, decoded with a KV cache). Each bucket is sampled from a generator seeded by the
call's seed and the bucket's first (prompt, sample), so the same call gives the same samples, ``stream`` included.
The returned logprobs are those of the sampled tokens under the raw logits (temperature 1: the policy itself, as
the trainer computes it), whatever the sampling temperature, top-p or top-k.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from rl_core.api import (
    InputError,
    LoraConfig,
    RefitPayload,
    Sample,
    lora,
    receive_weights,
    received_stats,
    thread_budget,
)
from rl_rollout_hf.config import HfGenerateConfig

#: one sequence to decode: (prompt_index, sample_index, prompt token ids)
Row = tuple[int, int, Sequence[int]]


class HfWorker:
    def __init__(
        self,
        *,
        model_path: str,
        cfg: HfGenerateConfig,
        replicas: int,
        dtype: str,
        device: str,
        trust_remote_code: bool = False,
        adapters: LoraConfig | None = None,
    ) -> None:
        """``adapters``: the run's LoRA config; refits then hold only the adapters' tensors, merged here onto the
        base weights."""
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        # Ray starts actors with OMP_NUM_THREADS=1: decode on this replica's share of the node's cores
        torch.set_num_threads(cfg.threads or thread_budget(max(1, len(os.sched_getaffinity(0)) // replicas)))
        self.cfg = cfg
        self.device = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype), "trust_remote_code": trust_remote_code}
        if cfg.attn_implementation:
            kwargs["attn_implementation"] = cfg.attn_implementation
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
        # sampling is set per call: none of the checkpoint's own defaults (top_k, repetition penalty, ...) apply
        model.generation_config = GenerationConfig()
        self.model = model.to(self.device).eval()
        #: with adapters: their scale, and the adapted layers' own weights, onto which each refit's adapters are merged
        self.adapter_scale = adapters.scale if adapters is not None else None
        self.base_weights: dict[str, torch.Tensor] = {}
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        eos = self.tokenizer.eos_token_id
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos or ())

    # -- generation -------------------------------------------------------------------------------------------------

    def _buckets(self, indices: Sequence[int], prompts: Sequence[Sequence[int]], n: int) -> list[list[Row]]:
        rows = sorted(
            ((index, j, prompt) for index, prompt in zip(indices, prompts, strict=True) for j in range(n)),
            key=lambda row: (len(row[2]), row[0], row[1]),
        )
        size = self.cfg.max_batch_size
        return [rows[i : i + size] for i in range(0, len(rows), size)]

    @torch.no_grad()
    def _decode(self, rows: list[Row], sampling: dict[str, Any]) -> list[Sample]:
        from transformers import GenerationConfig

        width = max(len(p) for _, _, p in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (_, _, prompt) in enumerate(rows):  # left padding: every row's next token is at the same column
            ids[i, width - len(prompt) :] = torch.tensor(list(prompt))
            mask[i, width - len(prompt) :] = 1
        stop_ids = self.eos_ids | set(sampling["stop_token_ids"])
        sample = sampling["temperature"] > 0
        config = GenerationConfig(
            max_new_tokens=sampling["max_new_tokens"],
            do_sample=sample,
            temperature=sampling["temperature"] if sample else 1.0,
            top_p=sampling["top_p"] if sample else 1.0,
            top_k=max(sampling["top_k"], 0) if sample else 0,
            eos_token_id=sorted(stop_ids),
            pad_token_id=self.pad_id,
            stop_strings=list(sampling["stop_strings"]) or None,
            output_logits=True,
            return_dict_in_generate=True,
        )
        if sampling["seed"] is not None:
            first_index, first_j, _ = rows[0]
            torch.manual_seed((sampling["seed"] * 1_000_003 + first_index * 1009 + first_j) % 2**31)
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=config,
            tokenizer=self.tokenizer if sampling["stop_strings"] else None,
        )
        new = out.sequences[:, width:].cpu()  # [b, steps]
        logits = torch.stack(out.logits, dim=1).float()  # [b, steps, V], raw (before temperature / top-p / top-k)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.to(logits.device).unsqueeze(-1)).squeeze(-1)
        return [
            self._sample(row, new[i].tolist(), logprobs[i].tolist(), stop_ids, sampling) for i, row in enumerate(rows)
        ]

    def _sample(
        self, row: Row, tokens: list[int], logprobs: list[float], stop_ids: set[int], sampling: dict[str, Any]
    ) -> Sample:
        """Cut a row's decoded tokens where it stopped (a stop token, kept; or a stop string, cut from the text)."""
        index, j, _ = row
        length, stopped = len(tokens), False
        for k, token in enumerate(tokens):
            if token in stop_ids:
                length, stopped = k + 1, True
                break
        text = str(self.tokenizer.decode(tokens[:length], skip_special_tokens=True))
        for k in range(1, length + 1) if sampling["stop_strings"] else ():
            prefix = str(self.tokenizer.decode(tokens[:k], skip_special_tokens=True))
            hits = [prefix.index(s) for s in sampling["stop_strings"] if s in prefix]
            if hits:
                length, stopped, text = k, True, prefix[: min(hits)]
                break
        finish = "stop" if stopped or length < sampling["max_new_tokens"] else "length"
        return (index, j, tokens[:length], text, logprobs[:length], finish)

    def generate(
        self, indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
    ) -> list[Sample]:
        return [s for rows in self._buckets(indices, prompts, sampling["n"]) for s in self._decode(rows, sampling)]

    def stream(
        self, indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
    ) -> Iterator[Sample]:
        """The samples of ``generate``, yielded bucket by bucket as each bucket finishes."""
        for rows in self._buckets(indices, prompts, sampling["n"]):
            for sample in self._decode(rows, sampling):  # noqa: UP028 - Ray sends into the generator: no yield from
                yield sample

    # -- weights and memory -----------------------------------------------------------------------------------------

    @torch.no_grad()
    def update_weights(self, payload: RefitPayload, rank_offset: int) -> list[tuple[Any, ...]]:
        """Copy the weights behind ``payload`` into the model in place (no reload); this process is broadcast
        receiver ``rank_offset``."""
        start = time.perf_counter()
        named = receive_weights(payload, rank=rank_offset, device=self.device)
        params = dict(self.model.named_parameters(remove_duplicate=False))
        if named and all(lora.is_adapter(name) for name, _ in named):
            self._merge_adapters(dict(named), params)
            return [received_stats(named, payload, time.perf_counter() - start)]
        self.base_weights.clear()  # whole weights: the base itself changed
        unknown = [name for name, _ in named if name not in params]
        if unknown:
            raise InputError(f"refit sent tensors the model does not have: {', '.join(unknown[:5])}")
        for name, tensor in named:
            params[name].copy_(tensor)
        missing = set(params) - {name for name, _ in named} - self._tied()
        if missing:
            raise InputError(
                f"refit did not send {len(missing)} of the model's tensors: {', '.join(sorted(missing)[:5])}"
            )
        return [received_stats(named, payload, time.perf_counter() - start)]

    def _merge_adapters(self, adapters: dict[str, torch.Tensor], params: dict[str, torch.nn.Parameter]) -> None:
        """Each adapted layer's weight := its base weight + scale * B @ A: the model stays plain (no adapter
        matmuls while decoding), and only the adapters travelled."""
        if self.adapter_scale is None:
            raise InputError("refit sent LoRA adapters, but this engine was started without policy.lora")
        for name, (a, b) in lora.pairs(adapters).items():
            if name not in params:
                raise InputError(f"refit sent an adapter for {name}, which the model does not have")
            base = self.base_weights.get(name)
            if base is None:  # the first adapter refit: keep the base weight (later ones reuse it, no copy)
                base = self.base_weights[name] = params[name].detach().clone()
            torch.addmm(base, b.to(base.dtype), a.to(base.dtype), alpha=self.adapter_scale, out=params[name].data)

    def _tied(self) -> set[str]:
        """Parameter names that share storage with another (tied embeddings): sent once."""
        seen: dict[int, str] = {}
        tied = set()
        for name, param in self.model.named_parameters(remove_duplicate=False):
            if param.data_ptr() in seen:
                tied |= {name, seen[param.data_ptr()]}
            seen.setdefault(param.data_ptr(), name)
        return tied

    def sleep(self) -> None:
        """Give the GPU memory back (the weights wait in host memory); a no-op on CPU."""
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake(self) -> None:
        if self.device.type == "cuda":
            self.model.to(self.device)
