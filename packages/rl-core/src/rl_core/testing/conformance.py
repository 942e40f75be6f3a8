"""The contract checks under their earlier import path (``rl_core.testing.conformance``), which plugin tests use;
they live in ``rl_core.certify.conformance``."""

from rl_core.certify.conformance import (
    check_reward_source,
    check_rollout_engine,
    check_training_backend,
    hf_logprobs,
    sample_batch,
)

__all__ = ["check_reward_source", "check_rollout_engine", "check_training_backend", "hf_logprobs", "sample_batch"]
