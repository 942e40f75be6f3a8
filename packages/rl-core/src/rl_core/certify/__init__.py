"""Certification: ``rl-core certify`` and the checks behind it, which catch silent wrongness in a training backend,
a rollout engine, a reward source, an environment or a generated task, each reported on a card with the number it
measured and the bound it was held to. One module per kind (``engine``, ``backend``, ``reward``, ``algorithm``,
``task``), one function per check; ``card``
holds the report card and the bounds, ``command`` builds a component from the registry as the command does.

The checks use tiny models built locally and a plain Hugging Face forward pass in this process as the reference.
They are functions of an already built component (``certify_engine``, ``certify_backend``,
``certify_reward_source``, ``certify_environment``, ``certify_task``), so that a plugin's own tests can call them on instances they
share. Numbers are held to fp32 bounds: logprobs within ``LOGPROB_BOUND`` of the reference, training invariant to
the batch split within ``INVARIANCE_BOUND``, checkpoints bit-exact.
"""

from rl_core.certify.algorithm import certify_algorithm
from rl_core.certify.backend import certify_backend
from rl_core.certify.card import INVARIANCE_BOUND, LOGPROB_BOUND, Card, CheckResult
from rl_core.certify.command import certify
from rl_core.certify.engine import certify_engine
from rl_core.certify.reward import certify_environment, certify_reward_source, reward_samples
from rl_core.certify.task import certify_task

__all__ = [
    "INVARIANCE_BOUND",
    "LOGPROB_BOUND",
    "Card",
    "CheckResult",
    "certify",
    "certify_algorithm",
    "certify_backend",
    "certify_engine",
    "certify_environment",
    "certify_reward_source",
    "certify_task",
    "reward_samples",
]
