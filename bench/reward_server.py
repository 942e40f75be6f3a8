"""Reward-server throughput: samples/s with request batching (micro-batches of 64 across requests) against
one-request-at-a-time scoring (micro-batch 1, no waiting), both at 64 concurrent clients sending one sample per
request, with a tiny (~1M) and a small (~25M) reward model and a rule (exact_match); plus p50/p99 latency. All servers
are real uvicorn processes on loopback. Batching amortises the per-call cost (request handling, a forward pass's fixed
overhead); once the model's own compute dominates (the small model on 2 cores) it cannot give much more.

Each mode runs twice: scoring in worker processes under a deadline (the default) and in the server's own process
(``--workers 0``, how the server scored before worker processes): the baseline the isolation must not fall behind.

    python bench/reward_server.py [--models exact_match,qwen2-tiny,qwen2-small] [--requests 2000] [--clients 64] [--reps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from harness import alternate, stats, write

from rl_core.data.tiny_models import ensure_tiny_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reward_model(root: Path, name: str) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    base = ensure_tiny_model(name)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(base, num_labels=1)).save_pretrained(root)
    AutoTokenizer.from_pretrained(base).save_pretrained(root)
    return root


def start(scorer: str, micro: int, wait_ms: float, workers: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rl_reward_server.cli",
            "serve",
            "--port",
            str(port),
            "--scorer",
            scorer,
            "--micro-batch-size",
            str(micro),
            "--max-wait-ms",
            str(wait_ms),
            "--workers",
            str(workers),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def load(url: str, requests: int, clients: int, scorer: str) -> tuple[float, list[float]]:
    """``requests`` one-sample requests from ``clients`` concurrent connections (aiohttp: httpx's async pool
    tops out near 200 requests/s at 64 connections on this machine, which would measure the client)."""
    import aiohttp

    async def run() -> tuple[float, list[float]]:
        sem = asyncio.Semaphore(clients)
        latencies: list[float] = []

        async def one(session: aiohttp.ClientSession, i: int) -> None:
            async with sem:
                start = time.perf_counter()
                body = {
                    "scorer": scorer,
                    "prompts": [f"Q{i}: 3 + 4 = ?"],
                    "responses": [f" {i % 19}"],
                    "metadata": [{"answer": "7"}],
                }
                async with session.post(f"{url}/v1/score", json=body) as r:
                    r.raise_for_status()
                    await r.read()
                latencies.append(time.perf_counter() - start)

        connector = aiohttp.TCPConnector(limit=clients)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            start = time.perf_counter()
            await asyncio.gather(*(one(session, i) for i in range(requests)))
            return requests / (time.perf_counter() - start), latencies

    return asyncio.run(run())


def measure(name: str, args: argparse.Namespace) -> dict:
    """``name``: a tiny model (a reward model built from it) or ``exact_match`` (a rule: the HTTP path alone)."""
    with tempfile.TemporaryDirectory() as tmp:
        if name == "exact_match":
            spec = lambda _micro: "exact_match"  # noqa: E731
        else:
            model = reward_model(Path(tmp), name)
            spec = lambda micro: f"reward_model:path={model},inference_micro_batch_size={micro}"  # noqa: E731
        scorer = spec(1).split(":")[0]
        servers = {
            f"{mode}{suffix}": start(spec(micro), micro, wait, workers)
            for mode, micro, wait in (("batched", 64, 2.0), ("one_at_a_time", 1, 0.0))
            for suffix, workers in (("", 1), ("_in_process", 0))
        }
        lat: dict[str, list[float]] = {k: [] for k in servers}
        try:
            for _name, (_p, url) in servers.items():
                load(url, 64, args.clients, scorer)  # warm-up

            def side(name: str) -> list[float]:
                rate, latencies = load(servers[name][1], args.requests, args.clients, scorer)
                lat[name] += latencies
                return [rate]

            rates = alternate({k: (lambda k=k: side(k)) for k in servers}, args.reps)
        finally:
            for proc, _url in servers.values():
                proc.terminate()
                proc.wait(timeout=30)
    medians = {k: stats(v) for k, v in rates.items()}

    def pct(values: list[float], q: float) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))]

    return {
        "model": name,
        "batched_samples_per_s": medians["batched"],
        "one_at_a_time_samples_per_s": medians["one_at_a_time"],
        "batched_in_process_samples_per_s": medians["batched_in_process"],
        "one_at_a_time_in_process_samples_per_s": medians["one_at_a_time_in_process"],
        "speedup": medians["batched"]["median"] / medians["one_at_a_time"]["median"],
        "workers_vs_in_process": {
            mode: medians[mode]["median"] / medians[f"{mode}_in_process"]["median"]
            for mode in ("batched", "one_at_a_time")
        },
        "latency_ms": {k: {"p50": pct(v, 0.5) * 1e3, "p99": pct(v, 0.99) * 1e3} for k, v in lat.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="exact_match,qwen2-tiny,qwen2-small")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    results = [measure(name, args) for name in args.models.split(",")]
    rows = []
    for r in results:
        b, o = r["batched_samples_per_s"]["median"], r["one_at_a_time_samples_per_s"]["median"]
        bi, oi = r["batched_in_process_samples_per_s"]["median"], r["one_at_a_time_in_process_samples_per_s"]["median"]
        lb, lo = r["latency_ms"]["batched"], r["latency_ms"]["one_at_a_time"]
        vs = r["workers_vs_in_process"]
        rows.append(
            (
                r["model"],
                f"{b:.0f} ({bi:.0f})",
                f"{o:.0f} ({oi:.0f})",
                f"**{r['speedup']:.1f}x**",
                f"**{vs['batched']:.2f}x** / **{vs['one_at_a_time']:.2f}x**",
                f"{lb['p50']:.0f} / {lb['p99']:.0f}",
                f"{lo['p50']:.0f} / {lo['p99']:.0f}",
            )
        )
    write(
        "reward_server",
        {"results": results},
        rows,
        (
            "scorer",
            "batched samples/s (in-process)",
            "one-at-a-time samples/s (in-process)",
            "batched / one-at-a-time",
            "worker processes / in-process: batched / one-at-a-time",
            "batched p50 / p99 ms",
            "one-at-a-time p50 / p99 ms",
        ),
        notes=f"{args.requests} requests of one sample from {args.clients} concurrent clients (aiohttp); scorers: "
        f"{', '.join(args.models.split(','))} (qwen2-*: random-init Qwen2 sequence classifiers, tiny ~1M, small ~25M; "
        "exact_match: a rule, the HTTP path alone), "
        f"{args.reps} alternating repetitions; client and server share the 2 cores. Scoring in worker processes (the "
        "default: a deadline per call, a pool per scorer) against the server's own process (`--workers 0`, the "
        "pre-worker server), in the same run.",
    )


if __name__ == "__main__":
    main()
