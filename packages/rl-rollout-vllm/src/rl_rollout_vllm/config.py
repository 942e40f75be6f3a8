"""``policy.generation.vllm_cfg``: the vLLM engine's config section (light: attrs only)."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class VllmConfig:
    """``policy.generation.vllm_cfg``: the vLLM rollout engine."""

    #: offer this engine for selection (the default engine where it is installed).
    enabled: bool = True
    #: devices each engine replica spans (tensor parallelism).
    tensor_parallel_size: int = attrs.field(default=1, validator=attrs.validators.gt(0))
    #: fraction of GPU memory vLLM may take (GPU only).
    gpu_memory_utilization: float = 0.5
    #: KV-cache size in GiB on CPU (vLLM otherwise asks for most of the machine's memory).
    kv_cache_gb: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))
    #: longest prompt + response; unset, ``policy.max_total_sequence_length``.
    max_model_len: int | None = None
    #: eager PyTorch instead of vLLM's compiled model (torch.compile; on CPU the first start of the tiny model
    #: compiles for ~35 s, later starts read vLLM's compile cache in ~6 s, any folder of the same model included:
    #: the in-process engine compiles on a stand-in named by the configs' content; decoding is 1.4x faster compiled).
    enforce_eager: bool = False
    #: CPU threads of each engine replica; unset, the node's cores divided among the replicas (the async engine:
    #: vLLM's own binding).
    threads: int | None = None
    #: reuse the KV cache of a prompt's prefix across requests (a multi-turn episode's next turn re-sends every
    #: earlier turn); vLLM's own default for most models.
    enable_prefix_caching: bool = True
    #: vLLM's async engine (``AsyncLLM``: engine core in its own process, requests streamed as each ends); unset,
    #: on with CUDA and off on CPU, where the async engine's core process would hold one core for its scheduler.
    async_engine: bool | None = None
