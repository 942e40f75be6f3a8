"""Where rewards come from: the core's rule-based reward sources (``sources``), its multi-turn environments
(``environments``), and the weighted sum of a run's sources (``combine``)."""
