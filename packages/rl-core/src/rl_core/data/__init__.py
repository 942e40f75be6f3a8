"""Data and models: prompt datasets, chat templates and the built-in synthetic tasks (``prompts``), resolving and
checking a model folder or Hub ID (``models``), and the tiny models built locally for tests and recipes
(``tiny_models``)."""
