"""A user's own data and model: every format ``datasets`` reads (files, folders, ``save_to_disk``), splits and
nested columns (verl's row shape), bad rows named by file and line, chat-message prompts rendered with the
tokenizer's template token for token, and a model ID resolved from the local Hugging Face cache offline."""

import json
import time
from pathlib import Path

import pytest

from rl_core.base.errors import ConfigError, InputError
from rl_core.base.schema import DataConfig
from rl_core.data.models import resolve_model_path
from rl_core.data.prompts import load_split, render_prompt

ROWS = [{"prompt": f"Q: {a} + 1 = ? A:", "answer": str(a + 1)} for a in range(6)]
#: a chat template that shows each role (the tiny tokenizer has none of its own)
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_formats(tmp_path: Path) -> dict[str, Path]:
    import datasets
    import pyarrow as pa

    ds = datasets.Dataset.from_list(ROWS)
    out = {"jsonl": tmp_path / "rows.jsonl", "parquet": tmp_path / "rows.parquet", "csv": tmp_path / "rows.csv"}
    out["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    ds.to_parquet(str(out["parquet"]))
    ds.to_csv(str(out["csv"]), index=False)
    out["json"] = tmp_path / "rows.json"
    ds.to_json(str(out["json"]))
    out["saved"] = tmp_path / "saved"
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(out["saved"]))
    out["folder"] = tmp_path / "folder"
    out["folder"].mkdir()
    ds.to_parquet(str(out["folder"] / "part-0.parquet"))
    out["arrow"] = tmp_path / "rows.arrow"  # an Arrow IPC stream, as datasets' arrow builder reads it
    with pa.OSFile(str(out["arrow"]), "wb") as sink, pa.ipc.new_stream(sink, ds.data.table.schema) as writer:
        writer.write_table(ds.data.table)
    return out


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "csv", "arrow", "saved", "folder"])
def test_every_format_datasets_reads_loads_the_same_rows(rl_registry, tmp_path: Path, kind: str):
    source = write_formats(tmp_path)[kind]
    rows = load_split(DataConfig(train_path=str(source)), "train", rl_registry.task)
    assert [{"prompt": r["prompt"], "answer": str(r["answer"])} for r in rows] == ROWS, kind


def test_splits_of_a_saved_dataset_and_verl_shaped_rows(rl_registry, tmp_path: Path):
    saved = write_formats(tmp_path)["saved"]
    assert len(load_split(DataConfig(val_path=str(saved), val_split="test"), "val", rl_registry.task)) == 2
    with pytest.raises(InputError, match="has the splits train, test; name one"):
        load_split(DataConfig(val_path=str(saved), val_split="nope"), "val", rl_registry.task)
    verl = tmp_path / "verl.jsonl"
    row = {
        "data_source": "toy",
        "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
        "reward_model": {"style": "rule", "ground_truth": "4"},
    }
    verl.write_text(json.dumps(row) + "\n")
    rows = load_split(
        DataConfig(train_path=str(verl), columns={"answer": "reward_model.ground_truth"}), "train", rl_registry.task
    )
    assert rows[0]["answer"] == "4" and rows[0]["prompt"] == row["prompt"]
    with pytest.raises(InputError, match=r"row 0 has no 'reward_model.truth' \(data.columns.answer\)"):
        load_split(
            DataConfig(train_path=str(verl), columns={"answer": "reward_model.truth"}), "train", rl_registry.task
        )


def test_a_bad_row_names_the_file_and_its_line_and_a_missing_path_the_rule(rl_registry, tmp_path: Path, capfd):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n{"prompt": oops}\n')
    with pytest.raises(InputError, match=r"bad.jsonl, line 4: not valid JSON"):
        load_split(DataConfig(train_path=str(bad)), "train", rl_registry.task)
    with pytest.raises(ConfigError, match=r"no file or folder at /.*/missing.parquet \(a path in a config file is"):
        load_split(DataConfig(train_path="missing.parquet"), "train", rl_registry.task)
    begun = time.monotonic()
    with pytest.raises(
        ConfigError, match=r"'someone/nothing' is neither a file or folder .* nor a dataset in the local"
    ):
        load_split(DataConfig(train_path="someone/nothing"), "train", rl_registry.task)
    assert time.monotonic() - begun < 5, "offline: no wait on the network (it took ~25 s)"
    load_split(DataConfig(train_path=str(write_formats(tmp_path)["parquet"])), "train", rl_registry.task)
    assert "Generating" not in capfd.readouterr().err, "no progress bars on the terminal"


def test_chat_message_prompts_are_rendered_token_for_token_with_the_template(tokenizer):
    tok = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tok.chat_template = TEMPLATE
    messages = [{"role": "user", "content": "Add 2+3."}]
    ids, text = render_prompt(tok, DataConfig(), messages)
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert ids == list(expected) and text == "<|user|>Add 2+3.<|endoftext|><|assistant|>"
    with_system, _ = render_prompt(tok, DataConfig(system_prompt="Be brief."), messages)
    assert tok.decode(with_system).startswith("<|system|>Be brief.<|endoftext|><|user|>")
    always, _ = render_prompt(tok, DataConfig(chat_template="always"), "Add 2+3.")
    assert always == ids, "a text prompt as one user message"
    plain, text = render_prompt(tok, DataConfig(), "Add 2+3.")
    assert plain == tok("Add 2+3.", add_special_tokens=False)["input_ids"] and text == "Add 2+3."
    with pytest.raises(InputError, match="the tokenizer has no chat template"):
        render_prompt(tokenizer, DataConfig(), messages)


def test_a_dataset_name_loads_from_the_local_datasets_cache_offline(rl_registry, tmp_path: Path, monkeypatch):
    """The datasets cache's own layout (ORG___NAME/default/0.0.0/HASH with NAME-train.arrow), as ``load_dataset``
    of a Hub dataset leaves it; nothing is downloaded."""
    import datasets
    from datasets.packaged_modules.parquet.parquet import Parquet

    cache = tmp_path / "datasets"
    source = write_formats(tmp_path)["parquet"]
    builder = Parquet(
        cache_dir=str(cache), dataset_name="someone___rows", data_files={"train": str(source)}, hash="0" * 16
    )
    builder.download_and_prepare()
    (built,) = (cache / "someone___rows").glob("default-*")  # a local build's config id: rename to a download's
    built.rename(cache / "someone___rows" / "default")
    folder = cache / "someone___rows" / "default" / "0.0.0" / ("0" * 16)
    (folder / "someone___rows-train.arrow").rename(folder / "rows-train.arrow")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    rows = load_split(DataConfig(train_path="someone/rows"), "train", rl_registry.task)
    assert [{"prompt": r["prompt"], "answer": str(r["answer"])} for r in rows] == ROWS
    with pytest.raises(
        ConfigError, match=r"'someone/absent' is neither a file or folder .* nor a dataset in the local"
    ):
        load_split(DataConfig(train_path="someone/absent"), "train", rl_registry.task)


def test_a_model_id_resolves_from_the_local_hugging_face_cache_offline(tmp_path: Path, monkeypatch, tiny_model_path):
    """The hub cache's own layout (models--ORG--NAME/snapshots/COMMIT, refs/main), as a download leaves it."""
    import shutil

    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--tiny" / "snapshots" / ("a" * 40)
    shutil.copytree(tiny_model_path, snapshot)
    (cache / "models--someone--tiny" / "refs").mkdir()
    (cache / "models--someone--tiny" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert Path(resolve_model_path("someone/tiny")) == snapshot
    with pytest.raises(InputError, match=r"policy.model_name: 'someone/absent' is not a local folder .* nor a model"):
        resolve_model_path("someone/absent")


def test_the_sampler_walks_each_epochs_seeded_shuffle_and_resumes_at_its_position():
    """Batches follow epoch ``e``'s order ``shuffle(range(n), Random(seed * 1_000_003 + e))`` across epoch ends
    (the order each run and each resume reproduces: the README's figures depend on it), shuffled once per epoch."""
    import random

    from rl_core.data.prompts import EpochSampler

    rows = [{"prompt": str(i)} for i in range(5)]

    def order(epoch: int) -> list[int]:
        ids = list(range(5))
        random.Random(1 * 1_000_003 + epoch).shuffle(ids)
        return ids

    expected = [rows[order(p // 5)[p % 5]] for p in range(12)]
    sampler = EpochSampler(rows, 3, seed=1)
    assert [row for _ in range(4) for row in sampler.next()] == expected
    resumed = EpochSampler(rows, 3, seed=1, position=7)
    assert resumed.next() + resumed.next() == [*expected[7:12], rows[order(2)[2]]]


def test_building_a_tiny_model_shows_no_library_progress_bar(tmp_path, capfd):
    """The demo's first screen is the run's own lines: transformers' "Writing model shards" bar stays off it."""
    from rl_core.data.tiny_models import ensure_tiny_model

    ensure_tiny_model("qwen2-tiny", root=tmp_path)
    out, err = capfd.readouterr()
    assert "Writing model shards" not in out + err and "it/s]" not in out + err, err[-500:]
