"""Logits only at the positions that carry loss (``dtensor_cfg.logits_at_loss_positions``, the default in training)
give the same logprobs, losses and gradients as logits everywhere: padded and packed rows, a model that soft-caps
its logits (Gemma 2), LoRA adapters, chunked log-softmax, and a model whose forward lacks ``logits_to_keep``.

The forward runs in-process (one rank, no process group): the same code each rank runs under Ray."""

from typing import Any

import pytest
import torch

from rl_backend_dtensor.config import DTensorConfig
from rl_backend_dtensor.forward import ModelForward
from rl_core.base.schema import LoraConfig, LossConfig
from rl_core.contracts import batch as B
from rl_core.contracts import lora
from rl_core.contracts import tokens as T
from rl_core.training.losses import ClippedPGLoss

VOCAB = 300


def tiny(kind: str) -> Any:
    from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    common.update(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if kind == "gemma2":  # soft-caps its logits: 30 * tanh(logits / 30)
        config = Gemma2Config(**common, head_dim=8, final_logit_softcapping=3.0)
    else:
        config = LlamaConfig(**common, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


class NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` (older or custom architectures): the plain path."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False, **inputs: torch.Tensor) -> Any:
        return self.inner(input_ids=input_ids, use_cache=use_cache, **inputs)


def rl_batch() -> B.Batch:
    """Prompts of 9-20 tokens, responses of 3-8 (loss on the response), right-padded, with advantages and the
    previous and reference logprobs a GRPO step carries."""
    g = torch.Generator().manual_seed(1)
    rows, spans = [], []
    for prompt, response in [(20, 3), (9, 8), (14, 5), (12, 6)]:
        rows.append(torch.randint(1, VOCAB, (prompt + response,), generator=g).tolist())
        spans.append((prompt, prompt + response))
    ids, attn = B.pad_rows(rows, 0)
    loss_mask = torch.zeros(ids.shape)
    for i, (start, end) in enumerate(spans):
        loss_mask[i, start:end] = 1.0
    shape = ids.shape
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss_mask,
        "advantages": torch.randn(shape[0], 1, generator=g) * loss_mask,
        "prev_logprobs": -torch.rand(shape, generator=g) * 3 * attn,
        "reference_logprobs": -torch.rand(shape, generator=g) * 3 * attn,
    }


def forward_of(model: Any, packing: bool = False, chunk: int | None = None, **cfg: Any) -> ModelForward:
    config = DTensorConfig(sequence_packing=packing, logprob_chunk_tokens=chunk, **cfg)
    return ModelForward(model, config, "lm", torch.device("cpu"))


def step(fwd: ModelForward, batch: B.Batch) -> tuple[torch.Tensor, Any, dict, int]:
    """One loss and backward; also how many positions the output layer ran at."""
    model = fwd.model
    model.zero_grad(set_to_none=True)
    loss_fn = ClippedPGLoss(cfg=LossConfig(reference_policy_kl_penalty=0.1))
    head = (model.inner if isinstance(model, NoLogitsToKeep) else model).get_output_embeddings()
    widths: list[int] = []
    hook = head.register_forward_hook(lambda _m, _i, out: widths.append(out.shape[-2]))
    logprobs = fwd.logprobs(batch)
    hook.remove()
    loss, _ = loss_fn(batch, logprobs, loss_fn.count(batch))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), loss.detach(), grads, sum(widths)


@pytest.mark.parametrize(
    ("kind", "packing", "chunk", "adapters"),
    [
        ("llama", False, None, False),
        ("llama", True, None, False),
        ("llama", False, 4, False),
        ("gemma2", False, None, False),
        ("gemma2", True, 4, False),
        ("llama", True, None, True),
        ("plain-forward", False, None, False),
    ],
    ids=["padded", "packed", "chunked", "softcapped", "softcapped-packed-chunked", "lora-packed", "no-logits_to_keep"],
)
def test_logits_at_loss_positions_give_the_same_loss_and_gradients(kind, packing, chunk, adapters):
    model = NoLogitsToKeep(tiny("llama")) if kind == "plain-forward" else tiny(kind)
    if adapters:
        model = lora.wrap(model, LoraConfig(enabled=True, rank=4, alpha=8), trainable=True)
        for name, p in model.named_parameters():  # adapters start at B = 0: move them so their gradients show
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    batch = rl_batch()
    mask = batch["loss_mask"].bool()
    full_lp, full_loss, full_grads, full_width = step(
        forward_of(model, packing, chunk, logits_at_loss_positions=False), batch
    )
    fwd = forward_of(model, packing, chunk)
    lp, loss, grads, width = step(fwd, batch)

    if kind == "plain-forward":
        assert width == full_width
        assert fwd.off == {
            "logits_at_loss_positions": "NoLogitsToKeep.forward takes no logits_to_keep",
            "shared_prefix": "it needs logits_at_loss_positions",
        }
    else:  # the union of the rows' response positions (packed: exactly the response tokens), not 22
        assert width == int(batch["loss_mask"].sum() if packing else batch["loss_mask"].any(0).sum())

    assert float((lp[mask] - full_lp[mask]).abs().max()) < 1e-5
    assert (lp[~mask] == 0).all(), "no logprob outside the loss is computed"
    assert float((full_lp[~mask & batch["attention_mask"].bool()]).abs().sum()) > 0, "the full path is the real one"
    assert float((loss - full_loss).abs()) < 1e-6
    assert grads.keys() == full_grads.keys() and grads
    worst = max(float((grads[k] - full_grads[k]).abs().max()) for k in grads)
    scale = max(float(g.abs().max()) for g in full_grads.values())
    assert worst <= 1e-5 * max(scale, 1.0), f"largest gradient difference {worst:.2e}"


def test_full_logprobs_match_hugging_face_with_packing():
    """Outside training (``logprobs()``), every real position is computed, packed or not."""
    model, batch = tiny("llama"), rl_batch()
    with torch.no_grad():
        hf = T.token_logprobs(
            model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["input_ids"]
        )
        for packing in (False, True):
            ours = forward_of(model, packing, logits_at_loss_positions=False).logprobs(batch)
            assert float((ours - hf * batch["attention_mask"]).abs().max()) < 1e-5


def test_a_micro_batch_without_loss_positions_still_reaches_every_weight():
    """Ranks pad with inert micro-batches (no loss position): the backward must still run through the whole model
    (FSDP reduces every gradient), with zero gradients."""
    model, batch = tiny("llama"), rl_batch()
    inert = {**batch, "loss_mask": torch.zeros_like(batch["loss_mask"])}
    lp = forward_of(model).logprobs(inert)
    (lp.sum() * 0).backward()
    assert all(p.grad is not None and float(p.grad.abs().max()) == 0 for p in model.parameters())
