"""The rl-core command line, run as users run it (a subprocess)."""

import json
import os
import subprocess
import sys

import pytest
import yaml


def rl_core(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rl_core.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_plugins_json_lists_the_four_plugins_with_kind_and_priority():
    out = rl_core("plugins", "--json")
    assert out.returncode == 0, out.stderr
    report = {p["plugin"]: p for p in json.loads(out.stdout)}
    expected = {
        "dtensor": ("rl-backend-dtensor", "training_backend", 100),
        "megatron": ("rl-backend-megatron", "training_backend", 200),
        "vllm": ("rl-rollout-vllm", "rollout_engine", 100),
        "reward_server": ("rl-reward-server", "reward_source", 0),
    }
    for plugin, (dist, kind, priority) in expected.items():
        entry = report[plugin]
        assert entry["distribution"] == dist and entry["version"] and entry["status"] == "loaded"
        assert any(c["kind"] == kind and c["priority"] == priority for c in entry["components"]), entry


def test_explain_selects_megatron_over_dtensor_and_the_override():
    out = rl_core(
        "plugins", "--explain", "policy.dtensor_cfg.enabled=True", "policy.megatron_cfg.enabled=True", "--json"
    )
    assert out.returncode == 0, out.stderr
    backend = json.loads(out.stdout)["training_backend"]
    assert backend["chosen"] == "megatron" and backend["runners_up"] == [{"name": "dtensor", "priority": 100}]
    named = rl_core("plugins", "--explain", "policy.megatron_cfg.enabled=True", "policy.backend=dtensor", "--json")
    assert named.returncode == 0, named.stderr
    assert json.loads(named.stdout)["training_backend"]["chosen"] == "dtensor"


def test_disabled_plugin_error_is_one_clear_message():
    out = rl_core(
        "plugins", "--explain", "policy.megatron_cfg.enabled=True", env={"RL_CORE_DISABLE_PLUGINS": "megatron"}
    )
    assert out.returncode == 2
    message = " ".join(out.stderr.split())
    assert "plugin 'megatron'" in message and "disabled by RL_CORE_DISABLE_PLUGINS" in message
    assert "Traceback" not in out.stderr


def test_typo_error_and_debug_traceback():
    out = rl_core("run", "grpo.num_prompt_per_step=3")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "did you mean 'grpo.num_prompts_per_step'" in " ".join(out.stderr.split())
    debug = rl_core("--debug", "run", "grpo.num_prompt_per_step=3")
    assert debug.returncode == 1 and "Traceback" in debug.stderr  # re-raised: Python exits with 1


def test_version_lists_every_package():
    out = rl_core("--version")
    assert out.returncode == 0, out.stderr
    for dist in ("rl-core", "rl-backend-dtensor", "rl-backend-megatron", "rl-rollout-vllm", "rl-reward-server"):
        assert dist in out.stdout


def test_plugin_subcommand_is_added():
    out = rl_core("reward-server", "serve", "--help")
    assert out.returncode == 0 and "--micro-batch-size" in out.stdout


@pytest.mark.parametrize("missing", ["/nonexistent/config.yaml"])
def test_missing_config_file(missing):
    out = rl_core("run", missing)
    assert out.returncode == 2 and "config file not found" in out.stderr


def test_config_reference_covers_plugin_sections():
    out = rl_core("config-reference")
    assert out.returncode == 0
    for key in (
        "`grpo.num_prompts_per_step`",
        "`policy.dtensor_cfg.sequence_packing`",
        "`loss_fn.ratio_clip_c`",
        "`policy.megatron_cfg.tensor_model_parallel_size`",
    ):
        assert key in out.stdout


def test_certify_prints_a_report_card_and_exits_by_its_verdict():
    card = rl_core("certify", "exact_match", "--json")
    assert card.returncode == 0, card.stderr
    report = json.loads(card.stdout)
    assert report["passed"] and report["kind"] == "reward source" and len(report["checks"]) >= 5
    table = rl_core("certify", "number_match")
    assert table.returncode == 0 and "rl-core certify: reward source 'number_match'" in table.stdout
    assert all(len(line) <= 160 for line in table.stdout.splitlines())
    missing = rl_core("certify", "nope")
    assert missing.returncode == 2 and "no component named 'nope'" in missing.stderr


def test_certify_option_for_an_engine_is_a_setting_of_its_own_section():
    """An engine's ``--option`` goes into its section, validated there: an unknown key is refused before anything
    starts, naming the section's keys (and before torch or transformers is imported: a typo's answer is at once)."""
    out = rl_core("certify", "hf", "--option", "max_batch=4", env={"PYTHONPROFILEIMPORTTIME": "1"})
    message = " ".join(line for line in out.stderr.splitlines() if not line.startswith("import time:"))
    assert out.returncode == 2 and "unknown config key 'policy.generation.hf_cfg.max_batch'" in message, out.stderr
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"torch", "transformers"}, "imported before the options were checked"
    bare = rl_core("certify", "hf", "--option", "max_batch")
    assert bare.returncode == 2 and "--option 'max_batch': give key=value" in bare.stderr


def test_a_reader_that_stops_early_is_not_an_error():
    """``rl-core plugins --json | head -3``: the closed pipe ends the command quietly, with status 0."""
    for _ in range(3):
        run = subprocess.run(
            f"set -o pipefail; {sys.executable} -m rl_core.cli plugins --json | head -3",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0 and "BrokenPipeError" not in run.stderr, run.stderr


def test_explain_lines_are_never_wrapped_when_piped():
    """The text the JSON of test_explain_selects_megatron_over_dtensor_and_the_override says, one line each."""
    out = rl_core("plugins", "--explain", "policy.megatron_cfg.enabled=true")
    assert out.returncode == 0, out.stderr
    assert "training backend: megatron (priority 200; also enabled: dtensor 100)" in out.stdout.splitlines()
    line = next(line for line in out.stdout.splitlines() if line.startswith("weight transport:"))
    assert line.endswith("else object_store") and len(line) > 80


def test_run_help_shows_examples_and_global_flags_work_after_the_subcommand():
    helped = rl_core("run", "--help")
    assert helped.returncode == 0 and "examples:" in helped.stdout and "grpo.max_num_steps=100" in helped.stdout
    after = rl_core("run", "grpo.num_prompt_per_step=3", "--debug")  # --debug after the subcommand: the traceback
    assert after.returncode == 1 and "Traceback" in after.stderr
    quiet = rl_core("run", "grpo.num_prompt_per_step=3", "--verbose")
    assert quiet.returncode == 2 and "unrecognized arguments" not in quiet.stderr


def test_dry_run_shows_config_components_placement_and_data_and_starts_nothing(tmp_path):
    out = rl_core("run", f"run_dir={tmp_path / 'run'}", "grpo.max_num_steps=3", "--dry-run")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for part in (
        "== resolved config",
        "max_num_steps: 3",
        "training backend: dtensor",
        "== placement",
        "train: 2048 rows",
    ):
        assert part in text, part
    assert "dry run: nothing started" in text and not (tmp_path / "run").exists()
    assert "val: 83 rows; each validation uses 83 (grpo.max_val_samples: 128)" in text, text[-500:]


def test_dry_run_shows_only_the_values_the_run_uses(tmp_path):
    """Data from files: the built-in task's row counts are not shown beside the files' (they are not read), and the
    rows a validation uses are the file's when it holds fewer than ``max_val_samples``. Nor other algorithms'
    sections, the settings of components not chosen (their ``enabled`` stays: selection reads it), an environment's
    settings without one, LoRA's when it is off."""
    for split, n in (("train", 12), ("val", 5)):
        (tmp_path / f"{split}.jsonl").write_text(
            "".join(json.dumps({"prompt": f"q{i}", "answer": "a"}) + "\n" for i in range(n))
        )
    out = rl_core(
        "run",
        f"run_dir={tmp_path / 'run'}",
        f"data.train_path={tmp_path / 'train.jsonl'}",
        f"data.val_path={tmp_path / 'val.jsonl'}",
        "--dry-run",
    )
    assert out.returncode == 0, out.stderr
    assert "num_train" not in out.stdout and "num_val" not in out.stdout and "task:" not in out.stdout, out.stdout
    shown = yaml.safe_load(out.stdout.split("== resolved config\n")[1].split("== components")[0])
    assert not {"ppo", "reinforce", "sft", "dpo", "reward_model", "distill"} & shown.keys(), shown.keys()
    assert "grpo" in shown and shown["policy"]["dtensor_cfg"]["logits_at_loss_positions"] is True
    assert shown["policy"]["megatron_cfg"] == {"enabled": False}
    assert shown["policy"]["generation"]["hf_cfg"] == {"enabled": True}  # vLLM won on priority
    assert shown["environment"] == {"name": None} and shown["policy"]["lora"] == {"enabled": False}
    assert (
        "train: 12 rows" in out.stdout
        and "val: 5 rows; each validation uses 5 (grpo.max_val_samples: 128)" in out.stdout
    )


def test_certify_hands_a_backends_declared_max_ranks_to_its_checks(monkeypatch, tmp_path):
    """A backend declaring ``max_ranks=1`` is refused 2-rank runs, so certify must skip its two-rank check: the
    command hands the declaration to ``certify_backend`` (whose skip is tested in tests/rl_backend_dtensor). Before,
    it passed none, and the two-rank check ran anyway."""
    import attrs

    from rl_core.certify import command
    from rl_core.certify.card import Card
    from rl_core.plugins.registry import Registry

    registry = Registry.discover()
    spec = attrs.evolve(registry.specs("training_backend")["dtensor"], max_ranks=1)
    seen: dict = {}
    monkeypatch.setattr(command, "init_ray", lambda *a, **k: None)
    monkeypatch.setattr(command, "certify_backend", lambda *a, **k: seen.update(k) or k["card"])
    command._certify_ray_component(spec, registry, [], quick=False, work=tmp_path, card=Card("training backend", "x"))
    assert seen["max_ranks"] == 1 and "two data-parallel ranks" in seen["variants"]


def test_a_report_cards_text_is_printed_as_written_not_read_as_markup():
    """The EOS check's bound "token_ids [eos], text ''" printed as "token_ids , text ''": rich read "[eos]" as a
    style tag. Every cell of the card is the checks' own text."""
    from rich.console import Console

    from rl_core.certify.card import Card

    card = Card("rollout engine", "x")
    card.run("an EOS ends the response", "token_ids [eos], text ''", lambda: (True, "token_ids [2], text ''", ""))
    console = Console(record=True, width=200)
    console.print(card.render())
    text = console.export_text()
    assert "token_ids [eos], text ''" in text and "token_ids [2], text ''" in text, text


def test_ctrl_c_or_sigterm_in_a_run_says_where_it_stopped_and_that_the_command_resumes(monkeypatch, tmp_path, capsys):
    """Interrupted after step 2 with step 2's checkpoint on disk: one line, exit status 130."""
    from rl_core import cli

    def interrupted_run(config, registry, console):
        console.step(1, 5, {"reward": 0.5})
        console.step(2, 5, {"reward": 0.5})
        (tmp_path / "run" / "checkpoints" / "step_000002").mkdir(parents=True)
        (tmp_path / "run" / "checkpoints" / "step_000002" / "state.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_config", interrupted_run)
    assert cli.main(["run", f"run_dir={tmp_path / 'run'}", "logger.progress=false"]) == 130
    out = capsys.readouterr().out
    assert "interrupted after step 2; the same command resumes from its step-2 checkpoint" in out, out


def test_sigterm_after_ray_starts_reaches_the_run_not_rays_stack_dump():
    """``ray.init`` installs a SIGTERM handler of its own and its core worker a C++ one that prints a raw stack dump
    and aborts; ``init_ray`` puts the process's own back, so SIGTERM ends a run as Ctrl-C does."""
    code = (
        "import os, signal, time\n"
        "from rl_core.base.schema import ClusterConfig\n"
        "from rl_core.distributed.cluster import init_ray\n"
        "def stop(_s, _f):\n    raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "init_ray(ClusterConfig(), verbose=False)\n"
        "try:\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(10)\n"
        "except KeyboardInterrupt:\n    print('interrupted cleanly')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "interrupted cleanly" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "SIGTERM received" not in out.stderr, out.stderr[-2000:]
