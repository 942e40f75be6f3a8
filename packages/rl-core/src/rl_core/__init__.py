"""rl_core: the small core of an RL post-training framework for language models."""

from rl_core.__about__ import __version__

__all__ = ["__version__"]
