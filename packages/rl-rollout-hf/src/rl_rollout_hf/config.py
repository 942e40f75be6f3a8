"""``policy.generation.hf_cfg``: the Hugging Face generate engine's config section (light: attrs only)."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class HfGenerateConfig:
    """``policy.generation.hf_cfg``: rollouts on Hugging Face ``generate`` (priority 50, below vLLM's 100)."""

    #: offer this engine for selection (below vLLM's priority).
    enabled: bool = True
    #: sequences (prompt x sample) per ``generate`` call; a replica's prompts are sorted by length and cut into
    #: buckets of this many, so that little padding is decoded.
    max_batch_size: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    #: CPU threads of each replica; unset, the node's cores divided among the replicas.
    threads: int | None = None
    #: transformers' attention implementation (``sdpa``, ``eager``, ``flash_attention_2``); unset, its default.
    attn_implementation: str | None = None
