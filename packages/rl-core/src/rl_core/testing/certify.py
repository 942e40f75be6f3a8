"""The certify checks under their earlier import path (``rl_core.testing.certify``), which plugin tests written
against the previous release use; they live in ``rl_core.certify``."""

from rl_core.certify import (
    INVARIANCE_BOUND,
    LOGPROB_BOUND,
    Card,
    CheckResult,
    certify,
    certify_backend,
    certify_engine,
    certify_environment,
    certify_reward_source,
    reward_samples,
)

__all__ = [
    "INVARIANCE_BOUND",
    "LOGPROB_BOUND",
    "Card",
    "CheckResult",
    "certify",
    "certify_backend",
    "certify_engine",
    "certify_environment",
    "certify_reward_source",
    "reward_samples",
]
