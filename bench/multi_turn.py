"""Multi-turn episodes through our vLLM engine: the lockstep schedule on vLLM's in-process engine (``LLM``, the CPU
default) is the baseline; against it, lockstep and streaming on vLLM's async engine (``AsyncLLM``, the GPU
default), and streaming with vLLM's prefix caching off. The environment answers every turn with a short tool
result, and a third of its steps (fixed by row and turn) take ``--tool-latency`` seconds, like a slow tool call.
Two more sides make the steps slow enough to matter (2 s). Each engine runs its sides in turn (three engines at
once would share the two cores).

    python bench/multi_turn.py [--model qwen2-small] [--reps 3] [--tool-latency 0.4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import attrs
from harness import stats, write

from rl_core.contracts.protocols import SamplingParams, Transition
from rl_core.data.tiny_models import ensure_tiny_model

ROWS, EPISODES_PER_ROW, MAX_TURNS, TOKENS_PER_TURN = 16, 4, 4, 24
PREAMBLE = "You may call a tool. Each call returns a number; use the numbers to answer the question. "


@attrs.frozen
class SlowTool:
    """Answers every turn with a number; the steps of (row + turn) % 3 == 0 sleep ``latency`` seconds first."""

    latency: float

    def reset(self, row: Mapping[str, Any]) -> tuple[str, Any]:
        return PREAMBLE + row["prompt"], (row["row"], 0)

    def step(self, state: Any, action: str) -> Transition:
        row, turn = state
        if (row + turn) % 3 == 0:
            time.sleep(self.latency)
        return Transition(observation=f" [tool: {row * 7 + turn}]\n", state=(row, turn + 1))

    def close(self) -> None:
        return None


#: engine (vLLM flavour, prefix caching) -> the sides measured on it: (name, schedule, slow tool steps' seconds);
#: ``None`` seconds means ``--tool-latency``.
ENGINES: dict[tuple[bool, bool], list[tuple[str, str, float | None]]] = {
    (False, True): [("lockstep, LLM", "lockstep", None)],
    (True, True): [
        ("lockstep, AsyncLLM", "lockstep", None),
        ("streaming, AsyncLLM", "streaming", None),
        ("lockstep, AsyncLLM, 2 s tool", "lockstep", 2.0),
        ("streaming, AsyncLLM, 2 s tool", "streaming", 2.0),
    ],
    (True, False): [("streaming, AsyncLLM, no prefix cache", "streaming", None)],
}


def measure(
    engine_key: tuple[bool, bool], model: str, reps: int, latency: float, registry: Any
) -> list[dict[str, Any]]:
    """Every side of one engine, each ``reps`` batches of episodes."""
    from transformers import AutoTokenizer

    from rl_core.config.loader import load_config
    from rl_core.data.prompts import parity_task
    from rl_core.distributed.cluster import init_ray
    from rl_core.testing.episodes import episode_context
    from rl_core.training.episodes import EnvironmentRunner, run_episodes
    from rl_rollout_vllm.engine import make_engine

    async_engine, prefix = engine_key
    path = str(ensure_tiny_model(model))
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = [{**r, "row": i} for i, r in enumerate(parity_task(ROWS, seed=3))]
    results = []
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [
            f"run_dir={run_dir}",
            f"policy.model_name={path}",
            "policy.max_total_sequence_length=256",
            f"environment.max_turns={MAX_TURNS}",
            f"environment.max_tokens_per_turn={TOKENS_PER_TURN}",
            "environment.max_total_tokens=160",
        ]
        config = load_config(None, overrides, registry)
        init_ray(config.cluster, verbose=False)
        section = attrs.evolve(
            config.section("policy.generation.vllm_cfg"), async_engine=async_engine, enable_prefix_caching=prefix
        )
        engine = make_engine(config, section)
        for side, schedule, seconds_slow in ENGINES[engine_key]:
            cfg = attrs.evolve(config.environment, schedule=schedule)
            runner = EnvironmentRunner(
                SlowTool(latency if seconds_slow is None else seconds_slow), "slow_tool", cfg, ()
            )
            ctx = episode_context(config, engine, tokenizer, runner, "vllm", registry.hook)
            params = SamplingParams(n=EPISODES_PER_ROW, max_new_tokens=TOKENS_PER_TURN, seed=0)
            run_episodes(ctx, runner, rows[:2], params)  # warm-up (compilation)
            seconds, tokens = [], []
            for rep in range(reps):
                start = time.perf_counter()
                rollouts = run_episodes(ctx, runner, rows, attrs.evolve(params, seed=rep + 1)).rollouts
                seconds.append(time.perf_counter() - start)
                tokens.append(sum(sum(r.sampled) for r in rollouts))
                print(f"  rep {rep + 1}/{reps} {side}: {seconds[-1]:.2f} s, {tokens[-1]} sampled tokens", flush=True)
            runner.close()
            episodes = ROWS * EPISODES_PER_ROW
            results.append(
                {
                    "side": side,
                    "seconds": stats(seconds),
                    "episodes_per_s": stats([episodes / s for s in seconds]),
                    "sampled_tokens_per_s": stats([t / s for t, s in zip(tokens, seconds, strict=True)]),
                }
            )
        engine.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2-small")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tool-latency", type=float, default=0.4)
    args = parser.parse_args()
    from rl_core.plugins.registry import Registry

    registry = Registry.discover()
    results = [r for key in ENGINES for r in measure(key, args.model, args.reps, args.tool_latency, registry)]
    base = results[0]["seconds"]["median"]
    rows = [
        (
            r["side"],
            f"{r['seconds']['median']:.2f}",
            f"{r['episodes_per_s']['median']:.1f}",
            f"{r['sampled_tokens_per_s']['median']:.0f}",
            f"**{base / r['seconds']['median']:.2f}x**",
        )
        for r in results
    ]
    write(
        "multi_turn",
        {"model": args.model, "tool_latency_s": args.tool_latency, "results": results},
        rows,
        ("schedule, engine", "s per batch", "episodes/s", "sampled tok/s", "speed vs lockstep on LLM"),
        notes=(
            f"{ROWS} rows x {EPISODES_PER_ROW} episodes of up to {MAX_TURNS} turns ({TOKENS_PER_TURN} tokens a turn) "
            f"on {args.model}; a third of the tool steps take {args.tool_latency} s (2 s where the side says so). Median of "
            f"{args.reps} batches, seeds 1-3 (the lockstep sides sample the same tokens; streaming seeds each episode)."
        ),
    )


if __name__ == "__main__":
    main()
