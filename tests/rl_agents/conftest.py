import pytest
from tool_writer import tool_overrides

from rl_core.config.loader import load_config


@pytest.fixture(scope="module")
def tool_config(rl_registry, tiny_model_path, tmp_path_factory):
    """The agent environment's config over the scripted tool-writing model."""
    return load_config(None, tool_overrides(tmp_path_factory.mktemp("run"), tiny_model_path), rl_registry)
