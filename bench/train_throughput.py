"""Training tokens/s of the DTensor backend against a bare single-process PyTorch loop on the same model, batch, loss
(NLL), optimizer (AdamW) and micro-batching, alternating in one process: one rank in a Ray actor (nothing to
shard: the model runs unwrapped) and two FSDP2 ranks over gloo splitting the cores. Two shapes:

- ``small``: the small model (qwen2-small, vocabulary 512), 32 rows x 128 tokens, loss on every token (SFT-like:
  nothing to skip), micro-batches of 16, one and two ranks;
- ``rl-wide-vocab``: the same body with a 32768-token vocabulary (random init, as real tokenizers are wide), 16
  rows of a 192-token prompt and a 64-token response, loss on the response (the RL shape), micro-batches of 8,
  one rank; also the backend with ``logits_at_loss_positions=false`` (logits everywhere, as before it), so the
  change is measured on its own. On this shape the logprob pass (``TrainingBackend.logprobs``: the previous and
  reference policies' forward, no gradient) is timed too, against the bare model's forward and log-softmax;
- ``rl-varied-lengths``: the same wide model, 32 rows of prompts from 64 to 320 tokens (evenly spread) and a
  64-token response, loss on the response, micro-batches of 16 (padded to the batch's longest row, as the bare loop
  and a fixed row count take them); also the backend with micro-batches by token budget
  (``dynamic_batching``: rows longest first, each micro-batch trimmed to its longest row) and with
  ``sequence_packing`` (each micro-batch's rows in one row, no padding; Hugging Face's SDPA path then masks
  attention across the whole packed row);
- ``rl-groups``: the GRPO shape on the small model: 8 prompts (64 to 192 tokens) x 8 sampled 64-token responses,
  loss on the responses, micro-batches of 16 (two groups); the backend runs each prompt once per micro-batch
  (``shared_prefix``, the default) and, as a variant, every row whole (``shared_prefix=false``), as the bare loop
  does.

    python bench/train_throughput.py [--shapes small,rl-wide-vocab,rl-varied-lengths,rl-groups] [--reps 3] [--steps 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import torch
from harness import alternate, fmt, kept_results, stats, this_run, write

from rl_core.contracts import batch as B
from rl_core.contracts import tokens as T
from rl_core.data.tiny_models import ensure_tiny_model

LR = 1e-5
SHAPES: dict[str, dict[str, Any]] = {
    "small": {"vocab": None, "rows": 32, "prompt": 0, "length": 128, "micro": 16, "ranks": (1, 2)},
    "rl-wide-vocab": {
        "vocab": 32768,
        "rows": 16,
        "prompt": 192,
        "length": 256,
        "micro": 8,
        "ranks": (1,),
        "variants": {"logits everywhere": {"logits_at_loss_positions": False}},
    },
    "rl-varied-lengths": {
        "vocab": 32768,
        "rows": 32,
        "prompt": (64, 320),
        "length": 64,
        "micro": 16,
        "ranks": (1,),
        "variants": {
            "token budget": {"dynamic_batching": True, "max_tokens_per_microbatch": 4096},
            "sequence packing": {"sequence_packing": True},
        },
    },
    "rl-groups": {
        "vocab": None,
        "rows": 64,
        "group": 8,
        "prompt": (64, 192),
        "length": 64,
        "micro": 16,
        "ranks": (1,),
        "variants": {"rows whole": {"shared_prefix": False}},
    },
}


def model_folder(vocab: int | None, tmp: Path) -> str:
    """The small model, or the same body with another vocabulary (random init)."""
    small = ensure_tiny_model("qwen2-small")
    if vocab is None:
        return str(small)
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(small)
    config.vocab_size = vocab
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp / f"vocab{vocab}")
    return str(tmp / f"vocab{vocab}")


def make_batch(vocab: int, rows: int, length: int, prompt: int | tuple[int, int] = 0, group: int = 1) -> B.Batch:
    """Random tokens; the loss on every position after the first ``prompt``. With ``prompt=(shortest, longest)``
    the prompts are of lengths evenly spread between the two, each followed by ``length`` response tokens
    (right-padded to the longest row); with ``group``, each prompt begins that many consecutive rows (a GRPO
    group's samples), each with a response of its own."""
    g = torch.Generator().manual_seed(0)
    if isinstance(prompt, int):
        ids = torch.randint(2, vocab, (rows, length), generator=g)
        loss_mask = torch.ones(ids.shape)
        loss_mask[:, :prompt] = 0.0
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}
    prompts = torch.linspace(prompt[0], prompt[1], rows // group).round().long()
    order = torch.randperm(rows // group, generator=g)  # lengths in no particular order, as rollouts come
    lengths = prompts[order].repeat_interleave(group).tolist()
    rows_ids = []
    for i in range(0, rows, group):
        head = torch.randint(2, vocab, (lengths[i],), generator=g).tolist()
        rows_ids += [head + torch.randint(2, vocab, (length,), generator=g).tolist() for _ in range(group)]
    ids, attn = B.pad_rows(rows_ids, 0)
    loss_mask = torch.zeros(ids.shape)
    for i, p in enumerate(lengths):
        loss_mask[i, p : p + length] = 1.0
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask}


class Bare:
    def __init__(self, model_path: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)

    @torch.no_grad()
    def logprobs(self, batch: B.Batch, steps: int) -> list[float]:
        """The logprob pass: one forward of the whole batch, the log-softmax at every position."""
        out = []
        for _ in range(steps):
            start = time.perf_counter()
            logits = self.model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
            ).logits
            T.token_logprobs(logits, batch["input_ids"])
            out.append(time.perf_counter() - start)
        return out

    def run(self, batch: B.Batch, steps: int, micro: int) -> list[float]:
        from rl_core.training.losses import NLLLoss

        loss_fn, out = NLLLoss(), []
        for _ in range(steps):
            start = time.perf_counter()
            self.opt.zero_grad()
            normalizer = loss_fn.count(batch)
            for mb in B.micro_batches(batch, micro):
                logits = self.model(
                    input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], use_cache=False
                ).logits
                loss, _ = loss_fn(mb, T.token_logprobs(logits, mb["input_ids"]), normalizer)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            out.append(time.perf_counter() - start)
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in shapes:
            shape = SHAPES[name]
            model = model_folder(shape["vocab"], Path(tmp))
            for ranks in shape["ranks"]:
                results.append({**this_run(), **measure(args, name, shape, model, ranks)})
    report(results, shapes)


def report(results: list[dict[str, Any]], shapes: list[str]) -> None:
    """The results JSON and table: this run's ``results`` on ``shapes``, the other shapes' rows kept."""
    results += kept_results("train_throughput", lambda r: r["shape"] in shapes or r["shape"] not in SHAPES)
    results.sort(key=lambda r: (list(SHAPES).index(r["shape"]), r["ranks"]))
    rows = [row(r) for r in results]
    write(
        "train_throughput",
        {"results": results},
        rows,
        (
            "shape",
            "ranks",
            "DTensor tok/s",
            "bare PyTorch tok/s",
            "DTensor / bare",
            "other settings / bare",
            "logprob pass / bare (other settings)",
            "s/step range (ours / bare)",
            "measured",
        ),
        notes="AdamW, NLL loss, fp32. small: qwen2-small, 32 rows x 128 tokens, loss on every token, micro-batches of "
        "16. rl-wide-vocab: the same body with a 32768-token vocabulary, 16 rows x (192 prompt + 64 response) tokens, "
        "loss on the response, micro-batches of 8. tok/s counts every token of the batch. The DTensor backend's ranks "
        "are Ray actors sharing the machine's 2 cores (one rank: unwrapped, 2 threads; two ranks: FSDP2 over gloo, 1 "
        "thread each) against the same loop in the benchmark process (2 threads), alternated. logprob pass: "
        "TrainingBackend.logprobs on the batch (one chunk of 16 rows, no gradient) vs the bare model's forward and "
        "log-softmax. Other settings: the same backend with logits everywhere (`logits_at_loss_positions=false`, as "
        "before that change) or with micro-batches by token budget (`dynamic_batching=true`, 4096 tokens: rows "
        "longest first, each micro-batch trimmed) or with its micro-batches packed (`sequence_packing=true`). "
        "rl-varied-lengths: 32 rows, prompts of 64 to 320 tokens and a 64-token response, micro-batches of 16; tok/s "
        "counts the rows' own tokens, not padding. rl-groups: qwen2-small, 8 prompts of 64 to 192 tokens x 8 rows "
        "with a 64-token response each, micro-batches of 16; the backend runs each prompt once per micro-batch "
        "(`shared_prefix`, default), rows whole as the other setting; tok/s counts the rows' own tokens. A run on some "
        "shapes keeps the other shapes' rows from the run before (each row's date and command in the JSON).",
    )


def row(entry: dict[str, Any]) -> tuple[str, ...]:
    o, b = entry["dtensor_step_s"], entry["bare_step_s"]
    others = entry["others_vs_bare"]
    lp = entry.get("logprob_pass")
    return (
        entry["shape"],
        str(entry["ranks"]),
        f"{entry['tokens_per_step'] / o['median']:.0f}",
        f"{entry['tokens_per_step'] / b['median']:.0f}",
        f"**{entry['dtensor_vs_bare']:.2f}x**",
        ", ".join(f"{k} {v:.2f}x" for k, v in others.items()) or "-",
        "-"
        if lp is None
        else f"**{lp['dtensor_vs_bare']:.2f}x**" + "".join(f"; {k} {v:.2f}x" for k, v in lp["others_vs_bare"].items()),
        f"{fmt(o['min'])}-{fmt(o['max'])} / {fmt(b['min'])}-{fmt(b['max'])}",
        entry["date"][:10],
    )


def measure(args: argparse.Namespace, name: str, shape: dict[str, Any], model: str, ranks: int) -> dict:
    from rl_core.config.loader import load_config
    from rl_core.distributed.cluster import init_ray
    from rl_core.plugins.registry import Registry

    registry = Registry.discover()
    batch = make_batch(int(batch_vocab(model)), shape["rows"], shape["length"], shape["prompt"], shape.get("group", 1))
    variants: dict[str, dict[str, Any]] = {"dtensor": {}, **shape.get("variants", {})}
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(
            None,
            [
                f"run_dir={run_dir}",
                f"policy.model_name={model}",
                f"policy.train_global_batch_size={shape['rows']}",
                f"policy.train_micro_batch_size={shape['micro']}",
                f"policy.optimizer.lr={LR}",
                f"policy.num_workers={ranks}",
                "policy.max_total_sequence_length=512",
            ],
            registry,
        )
        init_ray(config.cluster, verbose=False)
        sides = {key: backend_steps(config, changes, batch, args.steps) for key, changes in variants.items()}
        bare = Bare(model)
        bare.run(batch, 1, shape["micro"])  # warm-up
        bare.logprobs(batch, 1)
        sides["bare"] = (
            lambda: bare.run(batch, args.steps, shape["micro"]),
            lambda: bare.logprobs(batch, args.steps),
            lambda: None,
        )
        times = alternate({key: run for key, (run, _, _) in sides.items()}, args.reps)
        passes = alternate({key: lp for key, (_, lp, _) in sides.items()}, args.reps) if shape["prompt"] else None
        for _, _, close in sides.values():
            close()
    medians = {key: stats(t) for key, t in times.items()}
    entry = {
        "shape": name,
        "ranks": ranks,
        "tokens_per_step": float(batch["attention_mask"].sum()),
        "dtensor_step_s": medians["dtensor"],
        "bare_step_s": medians["bare"],
        "dtensor_vs_bare": medians["bare"]["median"] / medians["dtensor"]["median"],
    }
    others = [key for key in variants if key != "dtensor"]
    entry["others_step_s"] = {key: medians[key] for key in others}
    entry["others_vs_bare"] = {key: medians["bare"]["median"] / medians[key]["median"] for key in others}
    if passes is not None:
        lp = {key: stats(t) for key, t in passes.items()}
        entry["logprob_pass"] = {
            "step_s": lp,
            "dtensor_vs_bare": lp["bare"]["median"] / lp["dtensor"]["median"],
            "others_vs_bare": {key: lp["bare"]["median"] / lp[key]["median"] for key in others},
        }
    return entry


def backend_steps(config: Any, changes: dict[str, Any], batch: B.Batch, steps: int) -> tuple[Any, Any, Any]:
    """A started DTensor backend (``policy.dtensor_cfg`` with ``changes``), warmed up: (train ``steps``, ``steps``
    logprob passes, shut down)."""
    from rl_backend_dtensor.backend import make_backend
    from rl_backend_dtensor.config import DTensorConfig
    from rl_core.training.losses import NLLLoss

    section = config.section("policy.dtensor_cfg")
    assert isinstance(section, DTensorConfig)
    backend = make_backend(config, attrs.evolve(section, **changes))
    backend.train(batch, NLLLoss())
    backend.logprobs(batch)

    def logprobs() -> list[float]:
        out = []
        for _ in range(steps):
            start = time.perf_counter()
            backend.logprobs(batch)
            out.append(time.perf_counter() - start)
        return out

    def run() -> list[float]:
        out = []
        for _ in range(steps):
            start = time.perf_counter()
            backend.train(batch, NLLLoss())
            out.append(time.perf_counter() - start)
        return out

    return run, logprobs, backend.shutdown


def batch_vocab(model: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model).vocab_size


if __name__ == "__main__":
    main()
