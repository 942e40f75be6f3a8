"""Test helpers for rl-core and its plugins: tiny models, a Ray session, and conformance suites.

Installed as a pytest plugin (``pytest11`` entry point ``rl_core``): its fixtures are available to any test suite
in an environment where rl-core is installed. See ``rl_core.testing.conformance`` for the contract checks a
``TrainingBackend``, ``RolloutEngine`` or ``RewardSource`` must pass.
"""

from rl_core.data.tiny_models import TINY_MODELS, ensure_tiny_model

__all__ = ["TINY_MODELS", "ensure_tiny_model"]
