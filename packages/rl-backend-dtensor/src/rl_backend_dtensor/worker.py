"""One FSDP2 rank, run inside a Ray actor. The driver-side ``DTensorBackend`` sends each rank its shard.

With a single rank there is nothing to shard and the model runs unwrapped (FSDP2's per-block hooks cost ~30% of a
tiny model's training step on CPU), unless CPU offload asks for FSDP's offload policy."""

from __future__ import annotations

import inspect
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rl_backend_dtensor.config import DTensorConfig
from rl_core.api import (
    LossFunction,
    PolicyConfig,
    RefitPayload,
    RefitRoute,
    RefitSender,
    lora,
    make_optimizer,
    make_scheduler,
    thread_budget,
)
from rl_core.api import batch as B


class DTensorWorker:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        model_path: str,
        policy: PolicyConfig,
        cfg: DTensorConfig,
        seed: int,
        device: str,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.model_path, self.policy, self.cfg = model_path, policy, cfg
        threads = cfg.threads_per_worker or thread_budget(max(1, (os.cpu_count() or 1) // world_size))
        torch.set_num_threads(threads)
        self.device = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        self.chunk_tokens = cfg.logprob_chunk_tokens or (1024 if self.device.type == "cuda" else None)
        torch.manual_seed(seed)
        self.lora = policy.lora
        self.model: Any = None
        self.reference: Any = None
        self.refit_sender = RefitSender()

    # -- setup ------------------------------------------------------------------------------------------------------

    def address(self) -> tuple[str, int]:
        from rl_core.api import free_port, node_address

        return node_address()[0], free_port()

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        from rl_core.api import node_address

        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, timeout=timedelta(minutes=10))
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        self.model = self._load(trainable=True)
        trained = [p for p in self.model.parameters() if p.requires_grad]  # with LoRA: the adapters only
        self.optimizer = make_optimizer(trained, self.policy.optimizer)
        self.scheduler = make_scheduler(self.optimizer, self.policy.scheduler)
        ip, node_id = node_address()
        return {
            "rank": self.rank,
            "ip": ip,
            "node_id": node_id,
            "device": str(self.device),
            "threads": torch.get_num_threads(),
        }

    def _load(self, *, trainable: bool) -> Any:
        """The policy (``trainable``), or the reference: ``policy.reference_model_name`` if set, else the policy's
        starting weights."""
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        path = self.model_path if trainable else self.policy.reference_model_name or self.model_path
        model = self._from_pretrained(path)
        if trainable and self.cfg.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if trainable and self.lora.enabled:  # a frozen base with adapters; the reference is the base itself
            model = lora.wrap(model, self.lora, trainable=True)
        if not trainable:
            model.requires_grad_(False)
            model.eval()
        offload = self.cfg.cpu_offload and self.device.type == "cuda"
        if self.world_size == 1 and not offload:
            return model.to(self.device)
        kwargs: dict[str, Any] = {"mesh": self.mesh}
        if self.cfg.mixed_precision:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if offload:
            kwargs["offload_policy"] = CPUOffloadPolicy()
        blocks = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in blocks:
                fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        return model if offload else model.to(self.device)

    def _from_pretrained(self, path: str) -> Any:
        """The causal LM at ``path``, or with ``policy.head=score`` the same architecture with a one-output score
        head (new if ``path`` holds a causal LM) that knows the tokenizer's padding id, as serving it needs."""
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        kwargs: dict[str, Any] = {"dtype": torch.float32, "trust_remote_code": self.policy.trust_remote_code}
        if self.policy.head == "lm":
            return AutoModelForCausalLM.from_pretrained(path, **kwargs)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs)
        if not isinstance(getattr(model, "score", None), torch.nn.Module):
            raise TypeError(f"{type(model).__name__} has no `score` head; policy.head=score needs one")
        tokenizer = AutoTokenizer.from_pretrained(self.policy.tokenizer_name or path)
        model.config.pad_token_id = tokenizer.pad_token_id
        return model

    # -- forward --------------------------------------------------------------------------------------------------

    def _logprobs(self, model: Any, mb: B.Batch, loss_only: bool = False) -> torch.Tensor:
        """``[b, T]`` token logprobs of one micro-batch: zero on padding, and with ``loss_only`` zero wherever
        ``loss_mask`` is (the loss never reads there, so the logits there are not computed)."""
        ids, attn = mb["input_ids"].to(self.device), mb["attention_mask"].to(self.device)
        need = mb["loss_mask"].to(self.device) if loss_only else attn
        forward = self._picked if self.policy.head == "lm" else self._values
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.mixed_precision):
            if not self.cfg.sequence_packing:
                shared = B.split_shared_prefixes(ids, attn, need) if self._shares_prefixes(model, loss_only) else None
                if shared is not None:
                    return self._prefixed(model, ids, need, shared)
                return forward(model, ids, need, attention_mask=attn)
            packed, pos, lengths = B.pack(ids, attn)
            need = B.pack(need, attn)[0]  # [1, N]
            if self.policy.head == "lm":  # a document's first token is predicted from nothing of its own
                need = need * B.document_interiors(lengths).to(self.device)
            out = forward(model, packed, need, position_ids=pos.to(self.device))
            return B.unpack(out, lengths, ids.shape[1])

    def _picked(self, model: Any, ids: torch.Tensor, need: torch.Tensor, **inputs: Any) -> torch.Tensor:
        """``[R, T]`` logprobs of ``ids`` where ``need [R, T]`` is set, 0 elsewhere. A model whose forward takes
        ``logits_to_keep`` (every current Hugging Face causal LM) runs its output layer, its own logit scaling and
        the log-softmax only at the positions that predict a needed token in some row: ``[R, K, V]`` logits
        instead of ``[R, T, V]``, the same values (RL rows: prompts are most of the tokens, none carries loss)."""
        wanted = need[:, 1:].any(0)  # [T-1] positions whose next token is needed in some row
        if bool(wanted.all()) or not _takes(model, "logits_to_keep"):
            logits = model(input_ids=ids, use_cache=False, **inputs).logits  # [R, T, V]
            return B.token_logprobs(logits, ids, self.chunk_tokens) * (need > 0)
        keep = wanted.nonzero().squeeze(1)  # [K]
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=keep, **inputs).logits  # [R, K, V]
        picked = B.picked_logprobs(logits, ids[:, keep + 1], self.chunk_tokens)  # [R, K]
        out = picked.new_zeros(ids.shape)
        out[:, keep + 1] = picked
        return out * (need > 0)

    def _shares_prefixes(self, model: Any, loss_only: bool) -> bool:
        """Whether rows that begin alike may run their beginning once (``dtensor_cfg.shared_prefix``): logprobs at
        loss positions only, a forward that takes ``logits_to_keep`` and a cache, a model whose every layer attends
        to all earlier positions, and no activation checkpointing (it recomputes a layer's forward, which would
        write that layer's cache twice)."""
        wanted = self.cfg.shared_prefix and loss_only and self.policy.head == "lm"
        if not wanted or not _takes(model, "logits_to_keep", "past_key_values"):
            return False
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = inner.config.get_text_config(decoder=True)
        sliding = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
        layers = getattr(config, "layer_types", None) or ["full_attention"]
        return (
            not sliding
            and all(kind == "full_attention" for kind in layers)
            and not getattr(inner, "is_gradient_checkpointing", False)
        )

    def _prefixed(self, model: Any, ids: torch.Tensor, need: torch.Tensor, shared: B.SharedPrefixes) -> torch.Tensor:
        """``_picked`` with each distinct row beginning (a GRPO group's prompt) run once: its keys and values (the
        model's cache) are computed for the prefix alone and shared by the rows that begin with it, whose suffixes
        then run over them at their own positions. The same logprobs and gradients as the whole rows (the
        backward sums the rows' gradients into their shared prefix); the prompt's tokens are computed once per
        group instead of once per row."""
        from transformers import DynamicCache

        which = shared.row_prefix  # [B]
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
        values: list[torch.Tensor] = []
        hook = model.score.register_forward_hook(lambda _m, _i, out: values.append(out))
        try:
            model(input_ids=ids, use_cache=False, **inputs)
        finally:
            hook.remove()
        return values[0].squeeze(-1).float() * (need > 0)  # [R, T, 1] -> [R, T]

    def _micro_batches(self, shard: B.Batch, size: int, group_size: int) -> tuple[list[B.Batch], torch.Tensor | None]:
        """This rank's micro-batches, padded with inert ones so every rank runs the same number of passes, and the
        order their rows were taken in (None: the shard's). By token budget, the rows go longest first
        (``B.longest_first``): rows of like length share a micro-batch, which is trimmed to its longest row, so
        little padding is computed."""
        order = None
        if self.cfg.dynamic_batching:
            order = B.longest_first(shard, group_size)
            mbs = B.token_budget_micro_batches(B.select(shard, order), self.cfg.max_tokens_per_microbatch, group_size)
        else:
            mbs = B.micro_batches(shard, size, group_size)
        count = torch.tensor([len(mbs)])
        if self.world_size > 1:
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
        while len(mbs) < int(count):
            dummy = B.select(shard, slice(0, 1))
            dummy = {**dummy, "loss_mask": torch.zeros_like(dummy["loss_mask"])}
            mbs.append(dummy)
        return mbs, order

    @torch.no_grad()
    def logprobs(self, shard: B.Batch, reference: bool = False) -> torch.Tensor:
        if reference and self.lora.enabled and not self.policy.reference_model_name:  # the base: adapters off
            with self.model.disable_adapter():
                return self._all_logprobs(self.model, shard)
        if reference and self.reference is None:
            self.reference = self._load(trainable=False)
        return self._all_logprobs(self.reference if reference else self.model, shard)

    def _all_logprobs(self, model: Any, shard: B.Batch) -> torch.Tensor:
        model.eval()
        rows = B.num_rows(shard)
        loss_only = self.cfg.logits_at_loss_positions
        chunks, order = self._micro_batches(shard, self.policy.logprob_batch_size, 1)
        parts = [self._logprobs(model, mb, loss_only).float().cpu() for mb in chunks]
        out = B.concat([{"input_ids": p} for p in parts])["input_ids"][:rows]  # [rows, T] in the chunks' order
        if order is None:
            return out
        restored = torch.empty_like(out)
        restored[order] = out  # back in the shard's order
        return restored

    # -- training -------------------------------------------------------------------------------------------------

    def train(self, shard: B.Batch, loss_fn: LossFunction, normalizer: float) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        mbs, _ = self._micro_batches(shard, self.policy.train_micro_batch_size, loss_fn.group_size)
        totals: dict[str, float] = {}
        for i, mb in enumerate(mbs):
            if self.world_size > 1:
                self.model.set_requires_gradient_sync(i == len(mbs) - 1)
            mb = {k: v.to(self.device) for k, v in mb.items()}
            logprobs = self._logprobs(self.model, mb, loss_only=self.cfg.logits_at_loss_positions)
            loss, metrics = loss_fn(mb, logprobs, normalizer)
            # FSDP averages gradients over ranks; the loss is already a share of the global sum, so undo that.
            (loss * self.world_size).backward()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        grad_norm = self._clip()
        self.optimizer.step()
        self.scheduler.step()
        return {**totals, "grad_norm": grad_norm, "lr": float(self.scheduler.get_last_lr()[0])}

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.policy.max_grad_norm if self.policy.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    # -- weights and checkpoints ----------------------------------------------------------------------------------

    def _full_state_dict(self, on_device: bool = False, adapters_only: bool = False) -> dict[str, torch.Tensor]:
        """Full weights on rank 0 (with LoRA: ``peft``'s names, or only the adapters'). With one rank the local
        shards already are the full tensors: no gather, no copy (refit and export then read the live parameters)."""
        if self.world_size == 1:
            local = {n: t.to_local() if hasattr(t, "to_local") else t for n, t in self.model.state_dict().items()}
            return {
                n: t.detach() if on_device or t.device.type == "cpu" else t.detach().cpu()
                for n, t in local.items()
                if not adapters_only or lora.is_adapter(n)
            }
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=not on_device, ignore_frozen_params=adapters_only)
        full: dict[str, torch.Tensor] = get_model_state_dict(self.model, options=options)  # type: ignore[assignment]
        return full

    def _hf_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """Full weights in the plain model's names (with LoRA: the adapters merged in)."""
        full = self._full_state_dict(on_device)
        return lora.merged(full, self.lora.scale) if self.lora.enabled else full

    def weights_for_refit(self, route: RefitRoute) -> RefitPayload | None:
        """Rank 0's weights as a refit payload: the plain model's (Hugging Face names; with LoRA the adapters merged
        in), or with ``route.adapters_only`` the adapters' alone (``peft`` names). Other ranks take part in the
        gather and return None. On GPU the weights stay on the device (the GPU routes read them there)."""
        on_device = self.device.type == "cuda"
        if route.adapters_only and self.lora.enabled:
            weights = self._full_state_dict(on_device, adapters_only=True)
        else:
            weights = self._hf_weights(on_device)
        return self.refit_sender.publish(weights, route) if self.rank == 0 else None

    def save_checkpoint(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        # before the first step the optimizer has no state, and get_state_dict would give it one by a zero-lr step
        # (AdamW's step count then 1, not 0): that must neither change this run nor be what a load restores
        fresh = not self.optimizer.state
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._state_options())
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        if fresh:
            self.optimizer.state.clear()
        if self.rank == 0:
            torch.save(
                {"scheduler": self.scheduler.state_dict(), "rng": torch.get_rng_state(), "fresh_optimizer": fresh},
                Path(path) / "extra.pt",
            )
        if self.world_size > 1:
            dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        options = self._state_options()
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=options)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=options,
        )
        extra = torch.load(Path(path) / "extra.pt", weights_only=False)
        if extra.get("fresh_optimizer"):
            self.optimizer.state.clear()
        self.scheduler.load_state_dict(extra["scheduler"])
        torch.set_rng_state(extra["rng"])

    def _state_options(self) -> Any:
        """What a checkpoint holds: every weight, or with LoRA the adapters (the base is the model folder's)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(ignore_frozen_params=self.lora.enabled, strict=not self.lora.enabled)

    def export_hf(self, path: str) -> None:
        """The plain model (with LoRA: merged) at ``path``, and with LoRA its adapters at ``path/adapter`` (a
        ``peft`` folder)."""
        full = self._full_state_dict()
        if self.rank == 0:
            from transformers import AutoTokenizer

            if self.lora.enabled:
                self.model.save_pretrained(Path(path) / "adapter", state_dict=full)
                base = self.model.get_base_model()
                base.save_pretrained(path, state_dict=lora.merged(full, self.lora.scale), safe_serialization=True)
            else:
                self.model.save_pretrained(path, state_dict=full, safe_serialization=True)
            AutoTokenizer.from_pretrained(self.policy.tokenizer_name or self.model_path).save_pretrained(path)
        if self.world_size > 1:
            dist.barrier()

    def offload(self) -> None:
        """Move parameters and optimizer state to CPU while the engine generates (GPU only; a no-op on CPU). The
        last refit is released first: the engine has loaded it, and its CUDA IPC tensors would pin GPU memory."""
        self.refit_sender.release()
        if self.device.type == "cuda":
            self.model.to("cpu")
            _move_optimizer(self.optimizer, "cpu")
            torch.cuda.empty_cache()

    def onload(self) -> None:
        if self.device.type == "cuda":
            self.model.to(self.device)
            _move_optimizer(self.optimizer, self.device)


def _takes(model: Any, *arguments: str) -> bool:
    """Whether the (``peft``-wrapped or plain) model's forward takes these arguments (``logits_to_keep``: as
    positions; ``past_key_values``: a Hugging Face cache)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(arguments) <= set(inspect.signature(inner.forward).parameters)


def _move_optimizer(optimizer: torch.optim.Optimizer, device: Any) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device)
