"""The main job as a user runs it (``rl-core run`` in a subprocess): the default recipe improves held-out reward,
and a run killed with SIGKILL resumes to the metrics it had logged and to the same figures. The recipes that start
from its models (distillation, PPO) and the greedy eval run in this process, on the session's Ray."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_core.config.loader import load_config
from rl_core.launch.evaluate import EvalSettings, run_eval
from rl_core.launch.run import run_config
from rl_core.outputs.console import RunConsole

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
COMPARED = ("reward", "train/loss", "train/grad_norm", "val/reward", "response_length")


def start(run_dir: Path, *overrides: str, config: Path | None = None, output: Path | None = None) -> subprocess.Popen:
    """``rl-core run`` in a session of its own (a kill takes the local Ray it started with it); its output piped, or
    into ``output`` for a run that is killed rather than finished."""
    recipe = [str(config)] if config is not None else []
    cmd = [sys.executable, "-m", "rl_core.cli", "run", *recipe, f"run_dir={run_dir}", *overrides]
    stdout = open(output, "w") if output is not None else subprocess.PIPE  # noqa: SIM115 - the child holds it
    return subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def metrics(run_dir: Path) -> dict[int, dict]:
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = row  # a resumed run re-logs the steps after its checkpoint; the last one counts
    return rows


def kill_driver(proc: subprocess.Popen) -> list:
    """SIGKILL the driver alone, as `kill -9 PID` does; returns the processes it had started (Ray's, workers)."""
    import psutil

    family = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return family


def wait_gone(processes: list, seconds: float = 30.0) -> list:
    import psutil

    deadline = time.monotonic() + seconds
    alive = processes
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return alive


@pytest.fixture(scope="module")
def lora_recipe_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[int, dict]]:
    """The LoRA recipe (examples/configs/grpo_lora.yaml) with the Hugging Face generate engine, as a user whose
    machine dies mid-run has it: kill -9 of the driver alone at the step-20 checkpoint (at best mid-write), then the
    same command again, which resumes from step 10 and finishes. Its folder, the finishing run's output, and the
    metrics the killed run had logged. Its warm-up model and its trained model are the distillation test's student
    and teacher."""
    run = tmp_path_factory.mktemp("lora_recipe") / "run"
    command = (run, "policy.generation.backend=hf")
    recipe = ROOT / "examples/configs/grpo_lora.yaml"
    proc = start(*command, config=recipe, output=run.with_name("killed.log"))
    ckpts = run / "checkpoints"
    caught_mid_write = False
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if list(ckpts.glob(".tmp-step_000020-*")):
            caught_mid_write = True
            break
        if (ckpts / "step_000020").is_dir():
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be killed"
    left = wait_gone(kill_driver(proc))
    assert not left, f"processes of the killed run still alive 30 s later: {left}"
    killed = metrics(run)
    complete = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step_"))
    if caught_mid_write:
        assert complete == ["step_000010"], complete  # the half-written step 20 is not a checkpoint
    if "step_000020" in complete:  # a truncated shard: the checkpoint does not match its manifest
        shard = next((ckpts / "step_000020" / "policy").glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:-64])
        skipped = f"checkpoint step_000020 skipped: policy/{shard.name} has"
    else:
        skipped = ""
    out = finish(start(*command, config=recipe))
    said = " ".join(out.split())
    assert "resuming from" in said and "step_000010 (step 10)" in said and skipped in said, said[-2000:]
    return run, out, killed


def heldout(run: Path) -> tuple[float, float]:
    rows = metrics(run)
    return rows[0]["val/reward"], rows[max(rows)]["val/reward"]


@pytest.mark.parametrize("engine", ["vllm", "hf-lora"])
def test_default_recipe_improves_heldout_reward(request: pytest.FixtureRequest, tmp_path: Path, engine: str):
    """The README's main job with vLLM (the default), and its LoRA recipe (examples/configs/grpo_lora.yaml) with the
    Hugging Face generate engine: the README's figures (held-out reward 0.542 before GRPO, 1.000 after). The warm-up
    teaches the format only, so the model starts at chance (within [0.35, 0.65] of 83 prompts) and GRPO, of all
    weights or of adapters alone, must take it to >= 0.95. The LoRA run is killed and resumed on the way (see
    ``lora_recipe_run``): it must reach the same figures, and redo steps 11-20 exactly."""
    if engine == "hf-lora":
        run, out, killed = request.getfixturevalue("lora_recipe_run")
        resumed = metrics(run)
        logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert logged == list(range(61)), f"each step once: {logged}"
        redone = [s for s in killed if s > 10]
        assert redone[:10] == list(range(11, 21)) and "val/reward" in resumed[20], redone
        for step in redone:
            keys = [k for k in COMPARED if k in killed[step]]
            assert keys == [k for k in COMPARED if k in resumed[step]], (step, "the resumed run logs the same metrics")
            for key in keys:
                assert resumed[step][key] == pytest.approx(killed[step][key], rel=1e-5, abs=1e-6), (step, key)
        assert not list((run / "checkpoints").glob(".tmp-*"))
    else:
        run = tmp_path / "run"
        out = finish(start(run))
    engine = engine.removesuffix("-lora")
    assert "training backend: dtensor (priority 100" in out and f"rollout engine: {engine}" in out
    assert "warning" not in out.lower() and all(len(line) < 400 for line in out.splitlines()), out[-3000:]
    before, after = heldout(run)
    print(f"{engine}: held-out reward before GRPO {before:.3f}, after {after:.3f}")
    assert 0.35 <= before <= 0.65, f"the warm-up should leave the model at chance, not {before:.3f}"
    assert after >= 0.95, f"held-out reward did not reach the README's figure: {before:.3f} -> {after:.3f}"


def run_here(recipe: str, run: Path, overrides: list[str], registry) -> None:
    """``rl-core run examples/configs/RECIPE run_dir=RUN OVERRIDES`` in this process."""
    run_config(load_config(ROOT / "examples/configs" / recipe, [f"run_dir={run}", *overrides], registry), registry)


def test_distillation_recipe_lifts_the_student_to_its_teacher(
    lora_recipe_run: tuple, ray_session, rl_registry, tmp_path: Path
):
    """examples/configs/distill.yaml with the LoRA recipe's models: its warm-up model (at chance) is the student, its
    GRPO-trained model the teacher; the teacher's per-token signal alone (no task reward) must lift the student's
    held-out reward from chance to >= 0.9 (the docs' figure), and the reverse KL to the teacher must fall."""
    teacher = lora_recipe_run[0]
    run = tmp_path / "distill"
    overrides = [
        "warmup_recipe=null",  # the recipe's own warm-up would remake the same student
        f"policy.model_name={teacher / 'warmup' / 'final'}",
        f"policy.reference_model_name={teacher / 'final'}",
        "policy.generation.backend=hf",
        "logger.progress=false",
    ]
    run_here("distill.yaml", run, overrides, rl_registry)
    before, after = heldout(run)
    rows = metrics(run)
    kl = [rows[s]["distill/reverse_kl"] for s in sorted(rows) if "distill/reverse_kl" in rows[s]]
    print(f"distill: held-out reward {before:.3f} -> {after:.3f}; reverse KL {kl[0]:.3f} -> {kl[-1]:.3f}")
    assert 0.35 <= before <= 0.65 and after >= 0.9, (before, after)
    assert kl[-1] < kl[0] / 2, kl


def test_ppo_recipe_learns_with_its_critic_and_resumes_both(
    lora_recipe_run: tuple, ray_session, rl_registry, tmp_path: Path, capsys
):
    """examples/configs/ppo.yaml from the LoRA recipe's warm-up model (at chance; the recipe's own warm-up would
    remake it): PPO with a critic must take held-out reward to >= 0.95 (the README's figure) while the critic's
    loss falls; every checkpoint holds the critic, and a run resumed from the last one carries on with the trained
    critic (its loss stays low, where a new score head's starts several times higher)."""
    run = tmp_path / "ppo"
    overrides = [
        "warmup_recipe=null",
        f"policy.model_name={lora_recipe_run[0] / 'warmup' / 'final'}",
        "logger.progress=false",
    ]
    begun = time.monotonic()
    run_here("ppo.yaml", run, overrides, rl_registry)
    seconds = time.monotonic() - begun
    out = capsys.readouterr().out
    assert "starting the critic (dtensor, 1 rank(s))" in out and (run / "logs" / "value-0.log").is_file()
    before, after = heldout(run)
    rows = metrics(run)
    critic = [rows[s]["critic/loss"] for s in sorted(rows) if "critic/loss" in rows[s]]
    print(
        f"ppo: held-out reward {before:.3f} -> {after:.3f}; critic loss {critic[0]:.3f} -> {critic[-1]:.3f}; {seconds:.0f} s"
    )
    assert 0.35 <= before <= 0.65 and after >= 0.95, (before, after)
    assert sum(critic[-5:]) < sum(critic[:5]) / 4, critic
    assert "train/loss" not in rows[1] and "train/loss" in rows[3], "the critic's warm-up steps train no policy"
    last = max(int(p.name.removeprefix("step_")) for p in (run / "checkpoints").glob("step_*"))
    assert (run / "checkpoints" / f"step_{last:06d}" / "critic" / "extra.pt").is_file()
    # the resumed steps on the Hugging Face engine: what is checked is the critic's checkpoint, and that engine
    # starts ~10 s sooner than vLLM (no vLLM import, no compile)
    run_here("ppo.yaml", run, [*overrides, "ppo.max_num_steps=62", "policy.generation.backend=hf"], rl_registry)
    resumed = metrics(run)
    assert max(resumed) == 62 and resumed[61]["critic/loss"] < critic[0] / 4, (critic[0], resumed[61])


def test_eval_gives_the_runs_validation_back(lora_recipe_run: tuple, ray_session, rl_registry, tmp_path: Path):
    """Evaluation with its defaults (one greedy sample, the recipe's seed and validation rows) gives the run's
    validation figure back exactly: of its warm-up model (a model folder, the built-in recipe) the step-0
    val/reward (0.542, not a trivial 1.0), in this process. ``rl-core eval`` of the finished run folder with -k 4 at
    temperature 1: pass@4 and maj@4 over 4 samples a row, each sample in samples.jsonl, and only its report, samples
    and logs in its folder."""
    run = lora_recipe_run[0]
    settings = EvalSettings(out=tmp_path / "greedy")
    console = RunConsole(progress=False)
    report = run_eval(run / "warmup" / "final", ["policy.generation.backend=hf"], settings, rl_registry, console)
    assert sorted(p.name for p in (tmp_path / "greedy").iterdir()) == ["report.json", "samples.jsonl"]
    assert report["reward"] == heldout(run)[0] and report["rows"] == 83, report
    assert report["sampling"]["temperature"] == 0.0 and report["pass@1"] == report["reward"]
    cmd = [sys.executable, "-m", "rl_core.cli", "eval"]
    sampled = subprocess.run(
        [*cmd, str(run), "-k", "4", "--temperature", "1.0", "--json", "-o", str(tmp_path / "k4")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert sampled.returncode == 0, sampled.stdout[-3000:] + sampled.stderr[-3000:]
    report = json.loads((tmp_path / "k4" / "report.json").read_text())
    assert sorted(p.name for p in (tmp_path / "k4").iterdir()) == ["logs", "report.json", "samples.jsonl"]
    samples = [json.loads(line) for line in (tmp_path / "k4" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 83 and samples[-1]["row"] == 82
    # the figures recomputed from the samples (any grouping of 0/1 rewards has pass@4 >= maj@4: that proves nothing)
    groups: dict[int, list[dict]] = {}
    for s in samples:
        groups.setdefault(s["row"], []).append(s)
    assert all(len(g) == 4 for g in groups.values())

    def majority_right(group: list[dict]) -> bool:
        texts = ["".join(t["text"] for t in s["turns"] if t["role"] == "model").strip() for s in group]
        return group[texts.index(max(texts, key=texts.count))]["reward"] >= 1.0  # the first of equal counts

    assert report["pass@4"] == sum(any(s["reward"] >= 1.0 for s in g) for g in groups.values()) / 83, report
    assert report["maj@4"] == sum(majority_right(g) for g in groups.values()) / 83, report
    assert report["reward"] == sum(s["reward"] for s in samples) / len(samples) > 0.5, report
    # the learning-signal figures, from the same samples: groups of a row's 4 samples
    alike = sum(len({s["reward"] for s in g}) == 1 for g in groups.values()) / 83
    assert report["signal/equal_reward_groups"] == pytest.approx(alike), report
    assert report["signal/reward_nonzero"] == pytest.approx(sum(s["reward"] != 0 for s in samples) / len(samples))
    assert report["signal/fired/exact_match"] == report["signal/reward_nonzero"] and report["signal/samples"] == 4 * 83
