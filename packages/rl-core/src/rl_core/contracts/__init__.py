"""What components implement and exchange with the core: the protocols of a training backend, a rollout engine, a
reward source, an environment and a metrics logger (``protocols``), the worker actors behind a group backend or
engine (``workers``), token batches and their helpers (``batch``), and weight refit's payloads, sender and
receiver (``refit``). Plugins see all of it through ``rl_core.api``."""
