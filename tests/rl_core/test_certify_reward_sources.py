"""``rl-core certify`` for reward sources fails every planted bug, each on the check that names it, and passes the
real source each mutant wraps (the core's ``number_match``)."""

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from rl_core.certify.reward import certify_reward_source
from rl_core.rewards.sources import NumberMatch


class Passthrough:
    """The real source, unchanged: each mutant overrides ``score``."""

    def __init__(self) -> None:
        self.inner = NumberMatch()

    def score(self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]):
        return self.inner.score(prompts, responses, metadata)

    def close(self) -> None:
        pass


class DropsTheLast(Passthrough):
    def score(self, prompts, responses, metadata):
        return super().score(prompts, responses, metadata)[:-1]


class NaNForWrong(Passthrough):
    def score(self, prompts, responses, metadata):
        return [r if r > 0 else float("nan") for r in super().score(prompts, responses, metadata)]


class Sorted(Passthrough):
    """Rewards sorted, as a source that gathers results from workers in completion order might return them."""

    def score(self, prompts, responses, metadata):
        return sorted(super().score(prompts, responses, metadata))


class BatchCentred(Passthrough):
    """Subtracts the batch mean: a baseline belongs to the algorithm, and it makes rewards depend on the batch."""

    def score(self, prompts, responses, metadata):
        rewards = super().score(prompts, responses, metadata)
        mean = sum(rewards) / len(rewards)
        return [r - mean for r in rewards]


class SharedScratch(Passthrough):
    """Keeps the request on ``self`` while scoring: concurrent callers read each other's inputs."""

    def score(self, prompts, responses, metadata):
        self.pending = (list(prompts), list(responses), list(metadata))
        time.sleep(0.05)
        return super().score(*self.pending)


class ZipsSilently(Passthrough):
    """No length check: mismatched lists are cut to the shortest."""

    def score(self, prompts, responses, metadata):
        n = min(len(prompts), len(responses), len(metadata))
        return super().score(prompts[:n], responses[:n], metadata[:n])


MUTANTS = {
    DropsTheLast: "one finite reward per response",
    NaNForWrong: "one finite reward per response",
    Sorted: "rewards follow the order of the inputs",
    BatchCentred: "scoring in other batches (uneven, one at a time) gives the same rewards",
    SharedScratch: "4 concurrent callers get the rewards of their own inputs",
    ZipsSilently: "mismatched lengths raise a clear error",
}


def test_certify_passes_the_real_source():
    card = certify_reward_source(Passthrough())
    assert card.passed, card.failed()


@pytest.mark.parametrize("mutant", list(MUTANTS), ids=lambda m: m.__name__)
def test_certify_fails_every_planted_reward_source_bug(mutant):
    card = certify_reward_source(mutant())
    assert not card.passed and MUTANTS[mutant] in card.failed(), card.failed()


class CtrlC(Passthrough):
    """Ctrl-C arrives while the third check scores (the first two score twice: protocol check, whole batch, order)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0  # each instance counts its own calls: a rerun of the test starts again at 0

    def score(self, prompts, responses, metadata):
        self.calls += 1
        if self.calls == 3:
            raise KeyboardInterrupt
        return super().score(prompts, responses, metadata)


def test_ctrl_c_returns_the_card_so_far_and_says_what_did_not_run():
    from rl_core.api import RewardSourceSpec, hookimpl
    from rl_core.certify import certify
    from rl_core.plugins.registry import Registry

    class Plugin:
        @hookimpl
        def rl_reward_sources(self):
            return [RewardSourceSpec(name="ctrl_c", factory=lambda _options: CtrlC(), package="test")]

    registry = Registry.discover(entry_points=False, extra=[("ctrl_c", Plugin())])
    card = certify("ctrl_c", registry, work=None)
    assert [r.check for r in card.results][:2] == ["implements the protocol", "one finite reward per response"]
    assert card.results[-1].check == "interrupted" and not card.passed
    assert card.results[-1].detail == "later checks did not run"


class OldApi(Passthrough):
    """Written against an API that moved: its method raises the AttributeError such a plugin meets."""

    def score(self, prompts, responses, metadata):
        raise AttributeError("module 'rl_core.contracts.batch' has no attribute 'gone'")


def test_a_raising_plugin_is_a_failed_check_naming_its_method_and_a_failed_start_names_its_package():
    from rl_core.api import RewardSourceSpec, hookimpl
    from rl_core.certify import certify
    from rl_core.plugins.registry import Registry

    def cannot_start(_options):
        raise AttributeError("module 'rl_core.contracts.batch' has no attribute 'gone'")

    class Plugin:
        @hookimpl
        def rl_reward_sources(self):
            return [
                RewardSourceSpec(name="old_api", factory=lambda _options: OldApi(), package="rl-reward-old"),
                RewardSourceSpec(name="no_start", factory=cannot_start, package="rl-reward-old"),
            ]

    registry = Registry.discover(entry_points=False, extra=[("old", Plugin())])
    card = certify("old_api", registry, work=None)
    failed = [r for r in card.results if not r.passed]
    assert len(card.results) == 6 and len(failed) == 5, card.results  # every check ran and said why
    errors = [r for r in failed if r.measured == "error"]
    assert len(errors) == 4 and all(f"(raised in {__name__}.OldApi.score)" in r.detail for r in errors), failed
    card = certify("no_start", registry, work=None)
    (only,) = card.results
    assert only.check == "the component starts and its checks run" and not card.passed
    assert "reward source 'no_start' (rl-reward-old) failed to start: AttributeError" in only.detail, only.detail
