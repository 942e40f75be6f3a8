"""What an agent program's HTTP hop costs: the same multi-turn episodes run by the core's environment API (the
baseline) and by an agent program that calls the model through the run's OpenAI-compatible endpoint
(``rl-agents``), on one vLLM in-process engine (the CPU default), lockstep, the same rows and seeds. The tool is
``multi_turn.SlowTool`` without latency, written both ways; the two sides must sample the same tokens (checked),
so the ratio is the endpoint's overhead alone.

    python bench/agent_endpoint.py [--model qwen2-tiny] [--reps 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import attrs
from harness import alternate, fmt, stats, write
from multi_turn import EPISODES_PER_ROW, MAX_TURNS, PREAMBLE, ROWS, TOKENS_PER_TURN, SlowTool

from rl_core.contracts.protocols import SamplingParams
from rl_core.data.tiny_models import ensure_tiny_model


async def slow_tool_agent(row: dict[str, Any], client: Any) -> float:
    """``SlowTool`` as an agent program: ``MAX_TURNS`` completions, each answered with the tool's number."""
    text = PREAMBLE + row["prompt"]
    for turn in range(MAX_TURNS):
        out = await client.completions.create(model="policy", prompt=text, max_tokens=TOKENS_PER_TURN)
        text += out.choices[0].text + f" [tool: {row['row'] * 7 + turn}]\n"
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2-tiny")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from rl_agents.config import AgentConfig
    from rl_agents.host import AgentHost
    from rl_core.config.loader import load_config
    from rl_core.data.prompts import parity_task
    from rl_core.distributed.cluster import init_ray
    from rl_core.plugins.registry import Registry
    from rl_core.testing.episodes import episode_context
    from rl_core.training.context import Phases
    from rl_core.training.episodes import EnvironmentRunner
    from rl_core.training.rollouts import generate_and_score
    from rl_rollout_vllm.engine import make_engine

    registry = Registry.discover()
    path = str(ensure_tiny_model(args.model))
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = [{**r, "row": i} for i, r in enumerate(parity_task(ROWS, seed=3))]
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [
            f"run_dir={run_dir}",
            f"policy.model_name={path}",
            "policy.max_total_sequence_length=256",
            f"environment.max_turns={MAX_TURNS}",
            f"environment.max_tokens_per_turn={TOKENS_PER_TURN}",
            "environment.max_total_tokens=160",
            "environment.schedule=lockstep",
        ]
        config = load_config(None, overrides, registry)
        init_ray(config.cluster, verbose=False)
        engine = make_engine(config, attrs.evolve(config.section("policy.generation.vllm_cfg"), async_engine=False))
        host = AgentHost(AgentConfig(entry="agent_endpoint:slow_tool_agent"))
        drivers = {
            "environment API": EnvironmentRunner(SlowTool(0.0), "slow_tool", config.environment, ()),
            "agent via the endpoint": host,
        }

        contexts = {
            name: episode_context(config, engine, tokenizer, d, "vllm", registry.hook) for name, d in drivers.items()
        }
        params = SamplingParams(n=EPISODES_PER_ROW, max_new_tokens=TOKENS_PER_TURN, seed=1)
        sampled: dict[str, list[tuple[int, ...]]] = {}

        def side(name: str):
            def run() -> list[float]:
                start = time.perf_counter()
                scored = generate_and_score(contexts[name], rows, params, Phases())
                seconds = time.perf_counter() - start
                sampled[name] = [
                    tuple(t for t, s in zip(r.token_ids, r.sampled, strict=True) if s) for r in scored.rollouts
                ]
                return [seconds]

            return run

        for name in drivers:  # warm-up: compilation, the endpoint's start
            side(name)()
        seconds = alternate({name: side(name) for name in drivers}, args.reps)
        for driver in drivers.values():
            driver.close()
        engine.shutdown()
    same = sampled["environment API"] == sampled["agent via the endpoint"]
    assert same, "the two sides sampled different tokens: the ratio would not compare like with like"
    results = [{"side": name, "seconds": stats(s)} for name, s in seconds.items()]
    base = results[0]["seconds"]["median"]
    episodes = ROWS * EPISODES_PER_ROW
    table = [
        (
            r["side"],
            fmt(r["seconds"]["median"]),
            fmt(episodes / r["seconds"]["median"]),
            fmt(episodes * MAX_TURNS / r["seconds"]["median"]),
            f"**{base / r['seconds']['median']:.2f}x**",
        )
        for r in results
    ]
    write(
        "agent_endpoint",
        {"model": args.model, "results": results},
        table,
        ("episodes driven by", "s per batch", "episodes/s", "requests/s", "speed vs the environment API"),
        notes=(
            f"{ROWS} rows x {EPISODES_PER_ROW} episodes of {MAX_TURNS} turns ({TOKENS_PER_TURN} tokens a turn) on "
            f"{args.model}, vLLM's in-process engine, lockstep, seed 1; median of {args.reps} batches each, the sides "
            "alternating. Both sides sampled the same tokens (checked). The agent side's extra time is HTTP, the "
            "openai client, re-encoding the agent's text (its earlier ids reused, the tool's answers tokenized) and "
            "each agent's own thread and event loop (what keeps one agent from stalling the endpoint or the others)."
        ),
    )


if __name__ == "__main__":
    main()
