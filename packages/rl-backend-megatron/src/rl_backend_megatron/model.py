"""Building megatron-core's GPTModel from a Hugging Face config, and the token logprobs of a batch."""

from __future__ import annotations

from typing import Any

import torch


def transformer_config(hf: Any, tp: int, pp: int) -> Any:
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        num_attention_heads=hf.num_attention_heads,
        num_query_groups=hf.num_key_value_heads,
        ffn_hidden_size=hf.intermediate_size,
        kv_channels=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=hf.model_type == "qwen2",
        qk_layernorm=hf.model_type == "qwen3",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=torch.float32,
        # activations sent between pipeline stages: fixed [T, B, H] float32 tensors
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
        # the fused kernels need CUDA (and Transformer Engine / Apex)
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


def rope_base(hf: Any) -> int:
    params = getattr(hf, "rope_parameters", None) or {}
    return int(params.get("rope_theta") or getattr(hf, "rope_theta", None) or 10000)


def build_gpt(hf: Any, tp: int, pp: int, *, first_stage: bool = True, last_stage: bool = True) -> Any:
    """This pipeline stage's part of the model: the embedding on the first stage, the output layer on the last."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=hf.model_type == "qwen3")
    return GPTModel(
        config=transformer_config(hf, tp, pp),
        transformer_layer_spec=spec,
        vocab_size=hf.vocab_size,
        max_sequence_length=hf.max_position_embeddings,
        pre_process=first_stage,
        post_process=last_stage,
        share_embeddings_and_output_weights=bool(hf.tie_word_embeddings),
        position_embedding_type="rope",
        rotary_base=rope_base(hf),
    )


def forward(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """This stage's output: ``[B, T, V/tp]`` logits on the last pipeline stage, hidden states elsewhere (a stage
    after the first reads its input from the previous stage, set by the pipeline schedule). Causal attention alone
    is right for right-padded rows: real tokens never attend to the padding after them."""
    b, t = input_ids.shape
    position_ids = torch.arange(t, device=input_ids.device).unsqueeze(0).expand(b, t)
    return model(input_ids=input_ids, position_ids=position_ids, attention_mask=None)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` log p(x_t | x_<t) from vocab-parallel ``[B, T, V/tp]`` logits; position 0 holds 0."""
    from megatron.core import tensor_parallel

    nll = tensor_parallel.vocab_parallel_cross_entropy(
        logits[:, :-1].float().contiguous(), input_ids[:, 1:].contiguous()
    )
    return torch.nn.functional.pad(-nll, (1, 0))
