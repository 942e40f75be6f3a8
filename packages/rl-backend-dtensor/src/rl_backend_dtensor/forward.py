"""One model's forward passes over a micro-batch, as the DTensor worker runs them: whole rows, rows that run their
shared beginning once, or rows packed into one sequence; logits only where logprobs are needed. Which of these
shortcuts the model can take is decided once, when it is wrapped (``Paths``, with the reason for each that cannot);
``rl_backend_dtensor.exactness`` then checks that those it takes give what whole rows give."""

from __future__ import annotations

import inspect
from typing import Any

import attrs
import torch

from rl_backend_dtensor.config import DTensorConfig
from rl_core.api import batch as B
from rl_core.api import tokens as T

#: the shortcuts, by their ``policy.dtensor_cfg`` keys
SHORTCUTS = ("logits_at_loss_positions", "shared_prefix", "sequence_packing")


@attrs.frozen
class Paths:
    """Which shortcuts a pass takes (each a ``policy.dtensor_cfg`` key)."""

    logits_at_loss_positions: bool = False
    shared_prefix: bool = False
    sequence_packing: bool = False

    def without(self, name: str) -> Paths:
        """These paths with shortcut ``name`` off, and what needs it (sharing prefixes needs logits at loss
        positions only)."""
        off = {name: False, **({"shared_prefix": False} if name == "logits_at_loss_positions" else {})}
        return attrs.evolve(self, **off)


class ModelForward:
    """The forward passes of ``model`` (the policy, or the reference) with the shortcuts ``cfg`` enables and the
    model allows; ``off`` holds why each enabled one does not run."""

    def __init__(self, model: Any, cfg: DTensorConfig, head: str, device: torch.device) -> None:
        self.model, self.cfg, self.head, self.device = model, cfg, head, device
        self.chunk_tokens = cfg.logprob_chunk_tokens or (1024 if device.type == "cuda" else None)
        self.off: dict[str, str] = {}
        #: token positions run through the model so far (padding included): what the shortcuts save
        self.tokens = 0
        wanted = {name: bool(getattr(cfg, name)) for name in SHORTCUTS}
        for name, why in _ineligible(model, cfg, head).items():
            if wanted[name]:
                self.off[name] = why
                wanted[name] = False
        self.paths = Paths(**wanted)

    def turn_off(self, name: str, why: str) -> None:
        self.off[name] = why
        if name == "logits_at_loss_positions" and self.paths.shared_prefix:
            self.off["shared_prefix"] = "it needs logits_at_loss_positions, which is off"
        self.paths = self.paths.without(name)

    def logprobs(self, mb: B.Batch, paths: Paths | None = None) -> torch.Tensor:
        """``[b, T]`` token logprobs (or the score head's values) of one micro-batch: zero on padding, and with
        ``dtensor_cfg.logits_at_loss_positions`` zero wherever ``loss_mask`` is (the loss never reads there; with
        that shortcut on, the logits there are not computed)."""
        paths = paths or self.paths
        model = self.model
        ids, attn = mb["input_ids"].to(self.device), mb["attention_mask"].to(self.device)
        need = mb["loss_mask"].to(self.device) if self.cfg.logits_at_loss_positions else attn
        keep = paths.logits_at_loss_positions

        def forward(model: Any, ids: torch.Tensor, need: torch.Tensor, **inputs: Any) -> torch.Tensor:
            if self.head == "lm":
                return self._picked(model, ids, need, keep=keep, **inputs)
            return self._values(model, ids, need, **inputs)

        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.mixed_precision):
            if paths.sequence_packing:
                packed, pos, lengths = T.pack(ids, attn)
                need = T.pack(need, attn)[0]  # [1, N]
                if self.head == "lm":  # a document's first token is predicted from nothing of its own
                    need = need * T.document_interiors(lengths).to(self.device)
                out = forward(model, packed, need, position_ids=pos.to(self.device))
                return T.unpack(out, lengths, ids.shape[1])
            shared = T.split_shared_prefixes(ids, attn, need) if paths.shared_prefix else None
            if shared is not None:
                return self._prefixed(model, ids, need, shared)
            return forward(model, ids, need, attention_mask=attn)

    def _picked(self, model: Any, ids: torch.Tensor, need: torch.Tensor, *, keep: bool, **inputs: Any) -> torch.Tensor:
        """``[R, T]`` logprobs of ``ids`` where ``need [R, T]`` is set, 0 elsewhere. With ``keep``, the model's output
        layer, its own logit scaling and the log-softmax run only at the positions that predict a needed token in
        some row (its forward's ``logits_to_keep``): ``[R, K, V]`` logits instead of ``[R, T, V]``, the same values
        (RL rows: prompts are most of the tokens, none carries loss)."""
        self.tokens += ids.numel()
        wanted = need[:, 1:].any(0)  # [T-1] positions whose next token is needed in some row
        if not keep or bool(wanted.all()):
            logits = model(input_ids=ids, use_cache=False, **inputs).logits  # [R, T, V]
            return T.token_logprobs(logits, ids, self.chunk_tokens) * (need > 0)
        kept = wanted.nonzero().squeeze(1)  # [K]
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=kept, **inputs).logits  # [R, K, V]
        picked = T.picked_logprobs(logits, ids[:, kept + 1], self.chunk_tokens)  # [R, K]
        out = picked.new_zeros(ids.shape)
        out[:, kept + 1] = picked
        return out * (need > 0)

    def _prefixed(self, model: Any, ids: torch.Tensor, need: torch.Tensor, shared: T.SharedPrefixes) -> torch.Tensor:
        """``_picked`` with each distinct row beginning (a GRPO group's prompt) run once: its keys and values (the
        model's cache) are computed for the prefix alone and shared by the rows that begin with it, whose suffixes
        then run over them at their own positions. The same logprobs and gradients as the whole rows (the
        backward sums the rows' gradients into their shared prefix); the prompt's tokens are computed once per
        group instead of once per row."""
        from transformers import DynamicCache

        which = shared.row_prefix  # [B]
        self.tokens += shared.prefix_ids.numel()
        prefix = model(input_ids=shared.prefix_ids, attention_mask=shared.prefix_mask, use_cache=True, logits_to_keep=1)
        cache = DynamicCache(
            [(k.index_select(0, which), v.index_select(0, which)) for k, v, *_ in prefix.past_key_values]
        )
        columns = shared.suffix_index  # [B, S]
        mask = torch.cat([shared.prefix_mask.index_select(0, which), shared.suffix_mask], 1)  # [B, P + S]
        picked = self._picked(
            model,
            ids.gather(1, columns),
            need.gather(1, columns) * shared.suffix_mask,
            keep=True,
            attention_mask=mask,
            position_ids=columns,
            past_key_values=cache,
        )  # [B, S]
        out = picked.new_zeros(ids.shape).scatter_add(1, columns, picked)  # [B, T]
        # the prefix pass's output, weighted 0, joins the result: its backward then starts at the output too (not
        # only at the cache), as FSDP's pre-backward hooks (parameters gathered for each layer) expect
        return out + 0.0 * prefix.logits.sum()

    def _values(self, model: Any, ids: torch.Tensor, need: torch.Tensor, **inputs: torch.Tensor) -> torch.Tensor:
        """``[R, T]`` the score head's value at every position where ``need`` is set (0 elsewhere): what the head
        computes before the model pools one position per row, read by a hook so FSDP's forward runs as usual."""
        self.tokens += ids.numel()
        values: list[torch.Tensor] = []
        hook = model.score.register_forward_hook(lambda _m, _i, out: values.append(out))
        try:
            model(input_ids=ids, use_cache=False, **inputs)
        finally:
            hook.remove()
        return values[0].squeeze(-1).float() * (need > 0)  # [R, T, 1] -> [R, T]


def _ineligible(model: Any, cfg: DTensorConfig, head: str) -> dict[str, str]:
    """Why each shortcut cannot run on ``model``, for those that cannot (read from its config and its forward)."""
    out: dict[str, str] = {}
    if head != "lm":
        out["logits_at_loss_positions"] = "policy.head=score: the score head runs at every position (then masked)"
        out["shared_prefix"] = "policy.head=score"
    elif not takes(model, "logits_to_keep"):
        out["logits_at_loss_positions"] = f"{type(_inner(model)).__name__}.forward takes no logits_to_keep"
    if "shared_prefix" not in out:
        why = _no_sharing(model, cfg, needs_logits="logits_at_loss_positions" in out)
        if why:
            out["shared_prefix"] = why
    return out


def _no_sharing(model: Any, cfg: DTensorConfig, *, needs_logits: bool) -> str | None:
    """Why rows cannot share their beginning's keys and values on ``model`` (None: they can)."""
    inner = _inner(model)
    if not cfg.logits_at_loss_positions or needs_logits:
        return "it needs logits_at_loss_positions"
    if cfg.sequence_packing:
        return "sequence_packing runs instead"
    if not takes(model, "past_key_values"):
        return f"{type(inner).__name__}.forward takes no past_key_values (a cache)"
    local = _local_attention(inner.config.get_text_config(decoder=True))
    if local:
        return local
    if getattr(inner, "is_gradient_checkpointing", False):
        # it recomputes a layer's forward in the backward, which would write that layer's cache twice
        return "activation_checkpointing"
    return None


#: config fields through which models declare attention that stops short of the earlier positions (a window, a chunk):
#: Mistral/Qwen2's sliding_window, GPT-Neo's window_size, Longformer's attention_window, Llama 4's attention_chunk_size
LOCAL_SPANS = ("sliding_window", "window_size", "attention_window", "local_window_size", "attention_chunk_size")
#: layer kinds that attend to every earlier position
FULL_LAYERS = frozenset({"full_attention", "global", "attention"})


def _local_attention(config: Any) -> str | None:
    """How ``config`` declares attention that does not reach every earlier position, under any of the names models
    use (the start-up check's rows are shorter than such spans, so sharing is not proven there); None: it does not."""
    for name in LOCAL_SPANS:
        value = getattr(config, name, None)
        if isinstance(value, int | list | tuple) and value and getattr(config, f"use_{name}", True):
            return f"local attention (config.{name}={value})"
    layers = getattr(config, "layer_types", None) or getattr(config, "attention_layers", None) or []
    kinds = {str(kind) for kind in layers}
    if kinds - FULL_LAYERS:
        return f"layers that do not attend to every earlier position ({sorted(kinds)})"
    return None


def _inner(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def takes(model: Any, *arguments: str) -> bool:
    """Whether the (``peft``-wrapped or plain) model's forward takes these arguments (``logits_to_keep``: as
    positions; ``past_key_values``: a Hugging Face cache)."""
    return set(arguments) <= set(inspect.signature(_inner(model).forward).parameters)
