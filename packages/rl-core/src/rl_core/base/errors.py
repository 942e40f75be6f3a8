"""Errors that the CLI prints as one clear message (a traceback only with ``--debug``)."""

import difflib
from collections.abc import Iterable


class RLCoreError(Exception):
    """Base class: the message says what is wrong and how to fix it."""


class ConfigError(RLCoreError):
    """A config file or override is invalid; the message names the key or file."""


class PluginError(RLCoreError):
    """A plugin is missing, disabled, broken or ambiguous; the message names the package."""


class InputError(RLCoreError):
    """Bad input data (prompts, batches, model folders); the message names what and why."""


def closest(given: str, choices: Iterable[object]) -> str | None:
    """The choice a typo most likely meant, for "did you mean" hints."""
    close = difflib.get_close_matches(given, [str(c) for c in choices], n=1, cutoff=0.6)
    return close[0] if close else None
