"""Loading a run's configuration: YAML with ``defaults:`` and dotted overrides, validated into ``rl_core.base.schema``
with each plugin's own sections (``loader``), the built-in recipes (``recipes``), and the generated config
reference (``reference``)."""
