"""The HF engine of a test module, over that module's ``config``."""

import pytest


@pytest.fixture(scope="module")
def engine(ray_session, config):
    from rl_rollout_hf.engine import make_engine

    eng = make_engine(config, config.section("policy.generation.hf_cfg"))
    yield eng
    eng.shutdown()
