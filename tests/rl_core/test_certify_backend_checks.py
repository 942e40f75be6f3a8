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
