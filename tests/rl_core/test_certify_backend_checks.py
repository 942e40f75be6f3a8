"""Certify's gradient checks on a backend whose weights never move: a measured failure that says so, not a crash."""

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
