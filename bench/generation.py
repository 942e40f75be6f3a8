"""Generation tokens/s of our vLLM engine against Hugging Face ``generate`` on the same model and prompts (tiny
and small), and weight-refit throughput (GB/s) against model size, with the safetensors-bytes route as the
baseline. Both sides alternate in one process.

    python bench/generation.py [--models qwen2-tiny,qwen2-small] [--reps 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import torch
from harness import alternate, stats, write

from rl_core.contracts.protocols import SamplingParams
from rl_core.contracts.refit import RefitRoute, RouteKind
from rl_core.data.tiny_models import ensure_tiny_model

PROMPTS, NEW_TOKENS = 64, 64


def prompts(tokenizer) -> list[list[int]]:
    from rl_core.data.prompts import parity_task

    return [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in parity_task(PROMPTS, seed=3)]


def hf_generate(model, tokenizer, ids: list[list[int]]) -> tuple[float, int]:
    width = max(len(p) for p in ids)
    batch = torch.full((len(ids), width), tokenizer.pad_token_id)
    attn = torch.zeros_like(batch)
    for i, p in enumerate(ids):  # left padding for generation
        batch[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=batch,
            attention_mask=attn,
            max_new_tokens=NEW_TOKENS,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            pad_token_id=tokenizer.pad_token_id,
        )
    seconds = time.perf_counter() - start
    new = out[:, width:]
    tokens = int(((new != tokenizer.pad_token_id) & (new != tokenizer.eos_token_id)).sum()) + int(
        (new == tokenizer.eos_token_id).any(1).sum()
    )
    return seconds, tokens


def safetensors_refit(engine, backend) -> float:
    """Baseline route: serialize the full weights to safetensors bytes, ship them, deserialize and reload."""
    import ray
    from safetensors.torch import load, save

    from rl_core.contracts.refit import receive_weights

    start = time.perf_counter()
    payload = backend.weights_for_refit(RefitRoute(kind="object_store"))
    blob = save({k: v.clone() for k, v in receive_weights(payload)})

    def reload(worker, data: bytes) -> None:
        worker.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(load(data).items())})

    ray.get(engine.group.actors[0].__ray_call__.remote(reload, blob))
    return time.perf_counter() - start


def measure(name: str, reps: int, registry: Any) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_backend_dtensor.backend import make_backend
    from rl_core.config.loader import load_config
    from rl_core.distributed.cluster import init_ray
    from rl_rollout_vllm.engine import make_engine

    path = str(ensure_tiny_model(name))
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = prompts(tokenizer)
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [f"run_dir={run_dir}", f"policy.model_name={path}", "policy.max_total_sequence_length=128"]
        config = load_config(None, overrides, registry)
        init_ray(config.cluster, verbose=False)
        engine = make_engine(config, config.section("policy.generation.vllm_cfg"))
        from rl_rollout_hf.engine import make_engine as make_hf_engine

        hf_engine = make_hf_engine(config, config.section("policy.generation.hf_cfg"))
        backend = make_backend(config, config.section("policy.dtensor_cfg"))
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        params = SamplingParams(n=1, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=0)
        engine.generate(ids, params)  # warm-up (compilation)
        hf_generate(hf, tokenizer, ids[:2])

        def ours(eng: Any = engine) -> list[float]:
            start = time.perf_counter()
            out = eng.generate(ids, params)
            return [sum(len(r.token_ids) for r in out) / (time.perf_counter() - start)]

        ours(hf_engine)  # warm-up

        def baseline() -> list[float]:
            seconds, tokens = hf_generate(hf, tokenizer, ids)
            return [tokens / seconds]

        def refit(kind: RouteKind | None) -> list[float]:
            route = RefitRoute(kind=kind, receivers=tuple(engine.weight_receivers()))
            start = time.perf_counter()
            engine.update_weights(backend.weights_for_refit(route))
            return [time.perf_counter() - start]

        rates = alternate({"vllm": ours, "hf_engine": lambda: ours(hf_engine), "hf": baseline}, reps)
        hf_engine.shutdown()
        size = engine.update_weights(backend.weights_for_refit(RefitRoute())).num_bytes  # also a warm-up
        refit("broadcast")  # warm-up: forms the broadcast group
        routes = {
            "host_shm": lambda: refit(None),  # the automatic route: the engine shares the trainer's host
            "object_store": lambda: refit("object_store"),
            "broadcast": lambda: refit("broadcast"),
            "safetensors_bytes": lambda: [safetensors_refit(engine, backend)],
        }
        refits = alternate(routes, reps)
        engine.shutdown()
        backend.shutdown()
    r = stats(refits["host_shm"])
    return {
        "model": name,
        "vllm_tokens_per_s": stats(rates["vllm"]),
        "hf_engine_tokens_per_s": stats(rates["hf_engine"]),
        "hf_tokens_per_s": stats(rates["hf"]),
        "refit_bytes": size,
        "refit_s": r,
        "object_store_refit_s": stats(refits["object_store"]),
        "broadcast_refit_s": stats(refits["broadcast"]),
        "safetensors_refit_s": stats(refits["safetensors_bytes"]),
        "refit_gb_per_s": size / r["median"] / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="qwen2-tiny,qwen2-small")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from rl_core.plugins.registry import Registry

    registry = Registry.discover()
    results = [measure(name, args.reps, registry) for name in args.models.split(",")]
    gen_rows, refit_rows = [], []
    for res in results:
        v, h, r, o, b, s = (
            res[k]
            for k in (
                "vllm_tokens_per_s",
                "hf_tokens_per_s",
                "refit_s",
                "object_store_refit_s",
                "broadcast_refit_s",
                "safetensors_refit_s",
            )
        )
        size = res["refit_bytes"]
        e = res["hf_engine_tokens_per_s"]
        gen_rows.append(
            (
                res["model"],
                f"{v['median']:.0f}",
                f"{e['median']:.0f}",
                f"{h['median']:.0f}",
                f"**{v['median'] / h['median']:.2f}x**",
                f"**{v['median'] / e['median']:.2f}x**",
            )
        )
        refit_rows.append(
            (
                res["model"],
                f"{size / 1e6:.1f}",
                f"{r['median'] * 1e3:.0f}",
                f"{size / r['median'] / 1e9:.2f}",
                f"{o['median'] * 1e3:.0f}",
                f"{b['median'] * 1e3:.0f}",
                f"{s['median'] * 1e3:.0f}",
                f"**{s['median'] / r['median']:.2f}x**",
            )
        )
    write(
        "generation",
        {"results": results},
        gen_rows,
        (
            "model",
            "vLLM engine tok/s",
            "rl-rollout-hf engine tok/s",
            "bare HF generate tok/s",
            "vLLM / bare HF",
            "vLLM / hf engine",
        ),
        notes=f"{PROMPTS} prompts x {NEW_TOKENS} new tokens, sampling at temperature 1, fp32, medians of {args.reps} "
        "alternating runs. The two engines each run in a Ray actor with the machine's cores (one replica); bare HF "
        "generate runs in the benchmark process. What the rl-rollout-hf engine trades for needing no vLLM.",
    )
    write(
        "refit",
        {"results": results},
        refit_rows,
        (
            "model",
            "MB",
            "refit ms (host_shm route)",
            "GB/s",
            "object_store route ms",
            "broadcast route ms (gloo)",
            "safetensors-bytes route ms",
            "host_shm vs safetensors",
        ),
        notes="host_shm route (the automatic CPU route when the engine shares the trainer's host): trainer rank 0 -> "
        "one host shared-memory segment kept across refits -> vLLM `reload_weights`; object_store: Ray's object "
        "store (the route across hosts); against serialising the same weights to safetensors bytes and reloading "
        "those; the broadcast route (NCCL's on GPU) measured over gloo.",
    )


if __name__ == "__main__":
    main()
