"""What a run leaves behind and shows while it runs: the console (``console``), checkpoints (``checkpoint``),
metrics loggers and ``metrics.jsonl`` (``metrics``), the run's log files (``logs``) and the curves drawn from the
metrics (``plot``)."""
