"""Certify's backend checks without a backend: gradient checks on one whose weights never move (a measured failure
that says so, not a crash), and a check asked for by a name it does not have."""

import torch

from rl_core.certify.backend import STILL, Gradients, check_clipping, check_invariance


class Still(Gradients):
    """Every SGD step's update is zero, as a backend that never applies its optimizer's step gives."""

    def step(self, overrides):
        return {"w": torch.zeros(3)}, 0.5


def test_gradient_checks_fail_a_backend_that_never_moves_saying_so():
    grads = Still(make=lambda overrides: None, sgd=(), batch={}, loss_fn=None)
    assert check_invariance(grads, ["policy.train_micro_batch_size=1"]) == (False, STILL)
    assert check_clipping(grads) == (False, STILL)


def test_a_check_asked_for_by_a_name_certify_does_not_have_is_named_before_any_backend_starts(tmp_path):
    import pytest

    from rl_core.certify.backend import CLIPPING, certify_backend

    def make(overrides):
        raise AssertionError("no backend may start")

    with pytest.raises(ValueError, match=r"no backend check named 'clipping'; the checks: .*gradient clipping follows"):
        certify_backend(make, tmp_path, None, tmp_path / "work", only=["clipping"])
    assert CLIPPING == "gradient clipping follows policy.max_grad_norm"


class Fake:
    """A backend that only records its shutdown."""

    def __init__(self, key: tuple[str, ...]) -> None:
        self.key, self.down = key, False

    def shutdown(self) -> None:
        self.down = True


def test_backends_start_ahead_at_most_so_many_at_once_and_those_never_taken_are_shut_down():
    import threading
    import time

    import pytest

    from rl_core.certify.starts import AheadStarts

    lock, running, peak, made = threading.Lock(), [0], [0], []

    def make(overrides):
        ahead = threading.current_thread().name.startswith("certify-start")  # not the caller's thread
        with lock:
            running[0] += ahead
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= ahead
        if "fails" in overrides:
            raise RuntimeError("this start fails")
        made.append(Fake(tuple(overrides)))
        return made[-1]

    planned = [["a"], ["b"], ["fails"], ["c"], ["never taken"]]
    starts = AheadStarts(make, planned, at_once=2)
    assert starts(["a"]).key == ("a",) and sorted(starts.begun) == [("b",), ("fails",)]  # the next two, no more
    assert starts(["b"]).key == ("b",)
    with pytest.raises(RuntimeError, match="this start fails"):
        starts(["fails"])
    assert starts(["not planned"]).key == ("not planned",)  # made when asked for
    assert starts(["c"]).key == ("c",)
    starts.close()
    assert peak[0] == 2, "two start at once ahead of the caller, no more"
    assert [f.key for f in made if f.down] == [("never taken",)]
    one = AheadStarts(make, planned, at_once=1)  # each starts when taken: nothing ahead
    assert not one.begun and one(["a"]).key == ("a",)
    one.close()
