"""The public API holds for plugins: every name and signature of the last release (``packages/rl-core/api-0.1.json``)
is still there, a moved name answers through an alias that warns, and an outside plugin written against the old API
runs unmodified."""

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

import rl_core.api as api
from rl_core.contracts import tokens

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from api_snapshot import _entry, breaks, snapshot  # noqa: E402

BASELINE = json.loads((ROOT / "packages" / "rl-core" / "api-0.1.json").read_text())


def with_aliases(current: dict) -> dict:
    """``current`` plus the baseline's names that answer through a moved-name alias (each must warn)."""
    out = dict(current)
    for name in set(BASELINE) - set(current):
        module, _, attr = name.rpartition(".")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            obj = getattr(getattr(api, module) if module else api, attr, None)
        if obj is not None and any(issubclass(w.category, DeprecationWarning) for w in caught):
            out[name] = _entry(obj)
    return out


def test_every_name_and_signature_of_the_last_release_is_still_there():
    assert breaks(BASELINE, with_aliases(snapshot())) == []


def test_the_check_fails_on_a_removal_a_new_required_parameter_or_a_moved_one():
    now = snapshot()
    planted = {k: v for k, v in now.items() if k != "rollout_metrics"}
    planted["batch.split"] = {
        "kind": "function",
        "parameters": [*now["batch.split"]["parameters"], ["extra", "POSITIONAL_OR_KEYWORD", False]],
    }
    planted["run_loop"] = {**now["run_loop"], "parameters": now["run_loop"]["parameters"][::-1]}
    found = breaks(BASELINE, planted)
    assert "rollout_metrics: removed" in found
    assert "batch.split: new required parameter 'extra'" in found
    assert any(f.startswith("run_loop: parameter") and f.endswith("moved") for f in found)


def test_a_moved_name_warns_where_it_went_and_when_the_old_one_goes():
    with pytest.warns(
        DeprecationWarning,
        match=r"rl_core.api.batch.token_logprobs moved to rl_core.api.tokens.token_logprobs .* removed in rl-core 0.3",
    ):
        assert api.batch.token_logprobs is tokens.token_logprobs
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        api.batch.nothing  # noqa: B018


def test_an_outside_plugin_written_against_the_old_api_runs_unmodified():
    from outside.old_api_backend import train_step

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    ids, attention = api.batch.pad_rows([[1, 2, 3, 4], [5, 6, 7]], 0)
    rows = {
        "input_ids": ids,
        "attention_mask": attention,
        "loss_mask": attention.float(),
        "advantages": torch.tensor([[1.0], [-1.0]]) * attention,
        "generation_logprobs": torch.zeros(ids.shape),
        "prev_logprobs": torch.zeros(ids.shape),
        "reference_logprobs": torch.zeros(ids.shape),
        "sample_mask": torch.ones(2),
    }
    with pytest.warns(DeprecationWarning, match="moved to rl_core.api.tokens"):
        old_loss, old_grads = train_step(model, rows, micro_batch_size=1)
    model.zero_grad()
    loss_fn = api.ClippedPGLoss(cfg=api.LossConfig())
    logprobs = tokens.token_logprobs(model(ids), ids) * attention
    loss, _ = loss_fn(rows, logprobs, loss_fn.count(rows))
    loss.backward()
    assert old_loss == pytest.approx(float(loss.detach()), abs=1e-6)
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(old_grads, model.parameters(), strict=True))
