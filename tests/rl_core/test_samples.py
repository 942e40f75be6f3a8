"""What a run keeps of its rollouts in RUN_DIR/samples.jsonl: the untrained model's (step 1), every
``logger.save_samples_every`` steps and every validation's, a few per prompt, bounded."""

import json
from pathlib import Path
from types import SimpleNamespace

from rl_core.training.context import RunContext


def transcripts(prompts: int, per_prompt: int) -> list[dict]:
    return [
        {"prompt": f"p{p}", "turns": [{"role": "model", "text": f"r{i}"}], "reward": 0.0}
        for p in range(prompts)
        for i in range(per_prompt)
    ]


def test_samples_at_step_one_every_period_and_every_validation_a_few_per_prompt(make_config, tmp_path: Path):
    config = make_config("logger.save_samples_every=10", "logger.samples_per_prompt=2", "logger.max_samples=5")
    taken: list[tuple[int, int]] = []
    logger = SimpleNamespace(log_samples=lambda step, rows: taken.append((step, len(rows))))
    ctx = SimpleNamespace(config=config, run_dir=tmp_path, loggers=[logger])
    for step in (1, 2, 9, 10):
        RunContext.keep_samples(ctx, step, transcripts(4, 8))  # type: ignore[arg-type]
    RunContext.keep_samples(ctx, 0, transcripts(3, 1), split="val")  # type: ignore[arg-type]
    RunContext.keep_samples(ctx, 7, transcripts(3, 1), split="val")  # type: ignore[arg-type]
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["split"], r["step"]) for r in rows] == [("train", 1)] * 5 + [("train", 10)] * 5 + [("val", 0)] * 3 + [
        ("val", 7)
    ] * 3
    # two of each prompt, in order, cut at five rows
    assert [(r["prompt"], r["turns"][0]["text"]) for r in rows[:5]] == [
        ("p0", "r0"),
        ("p0", "r1"),
        ("p1", "r0"),
        ("p1", "r1"),
        ("p2", "r0"),
    ]
    assert taken == [(1, 5), (10, 5), (0, 3), (7, 3)]
    off = SimpleNamespace(config=make_config("logger.save_samples_every=0"), run_dir=tmp_path / "off", loggers=[])
    RunContext.keep_samples(off, 1, transcripts(1, 1), split="val")  # type: ignore[arg-type]
    assert not (tmp_path / "off").exists()
