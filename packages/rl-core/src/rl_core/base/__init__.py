"""The ground floor every other wing stands on: the error types (``errors``), where tiny models and caches live
(``paths``) and the config records (``schema``: frozen attrs classes, and the config as plain data). It imports
nothing else of rl_core."""
