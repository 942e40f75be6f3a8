"""The one-time HF -> Megatron conversion: where it goes, reuse, forced redo, crash safety, bad architectures."""

import json
import os
import subprocess
import sys

import pytest

from rl_backend_megatron.convert import conversion_root, convert_once, hf_to_megatron, megatron_to_hf
from rl_core.base.errors import InputError


def test_checkpoint_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("RL_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert conversion_root() == tmp_path / "explicit"
    monkeypatch.delenv("RL_MEGATRON_CHECKPOINT_DIR")
    assert conversion_root() == tmp_path / "hf" / "rl_core"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert conversion_root() == tmp_path / "home" / ".cache" / "huggingface" / "rl_core"


def test_conversion_is_reused_redone_on_demand_and_keyed_by_content(monkeypatch, tmp_path, tiny_model_path):
    monkeypatch.setenv("RL_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "mg"))
    logs: list[str] = []
    first = convert_once(tiny_model_path, log=logs.append)
    assert "converted" in logs[-1]
    mtime = (first / "megatron_weights.safetensors").stat().st_mtime_ns
    assert convert_once(tiny_model_path, log=logs.append) == first and "reusing" in logs[-1]
    assert (first / "megatron_weights.safetensors").stat().st_mtime_ns == mtime
    convert_once(tiny_model_path, force=True, log=logs.append)
    assert "converted" in logs[-1]
    # a changed source is a new conversion
    changed = tmp_path / "changed"
    changed.mkdir()
    for f in tiny_model_path.iterdir():
        (changed / f.name).write_bytes(f.read_bytes())
    config = json.loads((changed / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (changed / "config.json").write_text(json.dumps(config))
    assert convert_once(changed).name != first.name


def test_a_half_written_conversion_is_never_used(monkeypatch, tmp_path, tiny_model_path):
    monkeypatch.setenv("RL_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "mg"))
    import rl_backend_megatron.convert as conv

    def crash(*_a, **_k):
        raise KeyboardInterrupt("killed mid-way")

    monkeypatch.setattr(conv, "hf_to_megatron", crash)
    with pytest.raises(KeyboardInterrupt):
        convert_once(tiny_model_path)
    assert not any((tmp_path / "mg").iterdir()), "nothing half-written is left where a later run would look"
    monkeypatch.undo()
    monkeypatch.setenv("RL_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "mg"))
    assert (convert_once(tiny_model_path) / "meta.json").is_file()


def test_a_conversion_another_start_made_meanwhile_is_kept_not_replaced(monkeypatch, tmp_path, tiny_model_path):
    """Backends starting at once convert at once: the one that finishes second keeps the first one's folder (its
    backend may be reading it), where it used to delete it and put its own in its place."""
    monkeypatch.setenv("RL_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "mg"))
    import rl_backend_megatron.convert as conv

    real, theirs, calls = conv.hf_to_megatron, [], []

    def meanwhile(state, cfg):
        calls.append(1)
        if len(calls) == 1:  # another start converts and starts reading while this one converts
            theirs.append(convert_once(tiny_model_path))
            (theirs[0] / "read-by-its-backend").touch()
        return real(state, cfg)

    monkeypatch.setattr(conv, "hf_to_megatron", meanwhile)
    logs: list[str] = []
    assert convert_once(tiny_model_path, log=logs.append) == theirs[0] and "reusing" in logs[-1]
    assert (theirs[0] / "read-by-its-backend").is_file()
    assert [p.name for p in (tmp_path / "mg").iterdir()] == [theirs[0].name], "no half-made copy left"


def test_unsupported_architecture_lists_the_supported(tmp_path):
    from transformers import AutoConfig

    AutoConfig.for_model("gpt2", n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(InputError, match="converts llama, mistral, qwen2, qwen3 models; this checkpoint is a 'gpt2'"):
        convert_once(tmp_path)


def test_mapping_round_trips(tiny_model_path, tiny_llama_path):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    for path in (tiny_model_path, tiny_llama_path):
        hf = load_file(str(path / "model.safetensors"))
        cfg = AutoConfig.from_pretrained(path)
        back = megatron_to_hf(hf_to_megatron(hf, cfg), cfg)
        assert back.keys() == hf.keys()
        assert all((back[k] == hf[k]).all() for k in hf)


def test_cli_convert(tmp_path, tiny_model_path):
    env = {**os.environ, "RL_MEGATRON_CHECKPOINT_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "rl_core.cli", "megatron", "convert", str(tiny_model_path)]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0 and "converted" in first.stdout, first.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert "reusing the conversion" in again.stdout


@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "where"),
    [
        ("policy.megatron_cfg.optimizer.lr=1e-3", "policy.optimizer"),
        ("policy.megatron_cfg.scheduler.lr_decay_style=cosine", "policy.scheduler"),
    ],
)
def test_megatron_has_no_optimizer_of_its_own_to_ignore_policy_optimizer(make_config, override, where):
    """One optimizer setting for every backend: NeMo RL's megatron_cfg.optimizer / scheduler keys are refused with
    where the setting lives (they once made Megatron train at its own default lr while policy.optimizer.lr was
    silently ignored)."""
    from rl_core.base.errors import ConfigError

    with pytest.raises(
        ConfigError, match=rf"'{override.split('=')[0].rsplit('.', 1)[0]}' is not a setting here.*{where}"
    ):
        make_config("policy.megatron_cfg.enabled=true", override)
