"""Prompt and example data, through ``datasets``: local files (JSONL, JSON, Parquet, CSV, Arrow), folders (of such
files, or written by ``save_to_disk``), datasets already in the local Hugging Face cache (by name, offline), or
tasks generated from a seed (the core's below, and plugins' through ``rl_tasks``). Each example is a dict; the prompt lives under ``data.prompt_key``
(text, or a list of chat messages rendered with the tokenizer's chat template), everything else is metadata handed
to the reward sources (``data.columns`` maps fields to nested keys, as in verl's ``reward_model.ground_truth``).

Paths: one in a config file is relative to that file, one on the command line to the current folder."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rl_core.base.errors import ConfigError, InputError, PluginError
from rl_core.base.schema import DataConfig

Example = dict[str, Any]
log = logging.getLogger(__name__)


class Task(Protocol):
    """What ``data.task`` names: a registered ``rl_core.plugins.specs.TaskSpec``."""

    @property
    def package(self) -> str: ...
    @property
    def variants(self) -> bool: ...
    @property
    def generate(self) -> Callable[[str, Mapping[str, Any], int, int], list[Example]]: ...


#: finds the task of a name, or raises ``PluginError`` saying what to install (``Registry.task``)
FindTask = Callable[[str], Task]


def parity_task(n: int, seed: int, *, random_labels: bool = False) -> list[Example]:
    """ "Even or odd? 4 8 1 7" -> " odd" (the parity of the last digit). With ``random_labels`` the answers are coin flips (a format-only
    warm-up: the model learns how to answer, not what). Digits are spaced so each is one token."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        digits = [str(rng.randint(0, 9)) for _ in range(rng.randint(2, 5))]
        answer = "even" if int(digits[-1]) % 2 == 0 else "odd"
        if random_labels:
            answer = rng.choice(["even", "odd"])
        prompt = f"Even or odd? {' '.join(digits)}"
        out.append({"prompt": prompt, "answer": answer, "response": f" {answer}"})
    return out


def addition_task(n: int, seed: int, *, random_labels: bool = False) -> list[Example]:
    """ "Q: 3 + 4 = ? A:" -> "7", single digits."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        answer = str(rng.randint(0, 18) if random_labels else a + b)
        out.append({"prompt": f"Q: {a} + {b} = ? A:", "answer": answer, "response": f" {answer}"})
    return out


def parity_format_task(n: int, seed: int) -> list[Example]:
    """The parity questions with coin-flip answers: an SFT warm-up that teaches the format, not the rule."""
    return parity_task(n, seed, random_labels=True)


def calculator_task(n: int, seed: int) -> list[Example]:
    """ "Add 47+86." -> 133: sums of two-digit numbers, for the ``calculator`` environment."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"prompt": f"Add {a}+{b}.", "answer": str(a + b)})
    return out


def calculator_format_task(n: int, seed: int) -> list[Example]:
    """The calculator's SFT warm-up: transcripts that call the calculator and copy its result 40% of the time, and
    guess an answer otherwise: the model learns the format and how to copy, and prefers guessing, so that its
    greedy answers start all wrong and RL has to learn from rewards to use the tool."""
    rng = random.Random(seed)
    out = []
    for row in calculator_task(n, seed):
        expression = row["prompt"].removeprefix("Add ").removesuffix(".")
        if rng.random() < 0.4:
            response = f"<calc>{expression}</calc> = {row['answer']}\n<answer>{row['answer']}</answer>"
        else:
            response = f"<answer>{rng.randint(20, 198)}</answer>"
        out.append({**row, "response": response})
    return out


def guess_number_task(n: int, seed: int) -> list[Example]:
    """A secret number from 1 to 100 per row, for the ``guess_number`` environment."""
    rng = random.Random(seed)
    return [{"prompt": "Guess my number from 1 to 100. Guess:", "secret": rng.randint(1, 100)} for _ in range(n)]


TASKS: dict[str, Callable[[int, int], list[Example]]] = {
    "parity": parity_task,
    "parity_format": parity_format_task,
    "addition": addition_task,
    "calculator": calculator_task,
    "calculator_format": calculator_format_task,
    "guess_number": guess_number_task,
}


#: how a path's suffix is read by ``datasets``
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
#: files ``save_to_disk`` writes: a folder holding one is a saved dataset (or dict of splits)
_SAVED = ("dataset_info.json", "state.json", "dataset_dict.json")
PATH_RULE = "a path in a config file is relative to that file, one on the command line to the current folder"


def _quiet_datasets() -> Any:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def check_jsonl(path: Path) -> None:
    """Each non-empty line of ``path`` is a JSON object, or an error naming the file and the line (1-based)."""

    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise InputError(f"{path}, line {number}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}, line {number}: a {type(row).__name__}, not a JSON object")


def load_jsonl(path: str | Path) -> list[Example]:
    """Rows of a local JSONL file (``load_rows`` for any source)."""
    return load_rows(str(path), None, "data file")


def load_rows(source: str, split: str | None, key: str) -> list[Example]:
    """The rows of ``source`` (``split``: the split of a dataset that has several; unset, ``train``, or the only
    one). ``key`` names the config key in errors."""
    path = Path(source)
    if path.is_dir():
        return _rows_of_folder(path, split, key)
    if path.is_file():
        builder = _BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise InputError(f"{key}: {path} is not a file {', '.join(_BUILDERS)} reads; convert it, or give a folder")
        if path.suffix.lower() == ".jsonl":
            check_jsonl(path)
        return _rows(lambda ds: ds.load_dataset(builder, data_files=str(path), split="train"), path)
    return _rows_of_hub_cache(source, split, key)


def _rows(load: Callable[[Any], Any], where: Any) -> list[Example]:
    datasets = _quiet_datasets()
    try:
        dataset = load(datasets)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{where}: cannot be read ({type(exc).__name__}: {exc})") from None
    return [dict(row) for row in dataset]


def _pick(dataset: Any, split: str | None, where: Any) -> Any:
    """One split of a dataset dict: ``split``, else ``train``, else the only one."""
    if not hasattr(dataset, "keys"):
        return dataset
    names = list(dataset.keys())
    name = split or ("train" if "train" in names else names[0] if len(names) == 1 else None)
    if name not in names:
        raise InputError(f"{where} has the splits {', '.join(names)}; name one (data.train_split / data.val_split)")
    return dataset[name]


def _rows_of_folder(path: Path, split: str | None, key: str) -> list[Example]:
    if any((path / name).is_file() for name in _SAVED):
        return _rows(lambda ds: _pick(ds.load_from_disk(str(path)), split, path), path)
    if not any(p.suffix.lower() in _BUILDERS for p in path.rglob("*") if p.is_file()):
        raise InputError(f"{key}: {path} holds no dataset (no {', '.join(_BUILDERS)} files, nor save_to_disk's)")
    return _rows(lambda ds: _pick(ds.load_dataset(str(path)), split, path), path)


def _rows_of_hub_cache(name: str, split: str | None, key: str) -> list[Example]:
    """A dataset by Hugging Face name, from the local cache only (nothing is downloaded)."""

    def load(ds: Any) -> Any:
        import huggingface_hub.constants as hub

        # the libraries read HF_HUB_OFFLINE from the environment once, at import: set on their modules (else a
        # name not in the cache waits ~25 s on an unreachable network before failing)
        switches = [(m, "HF_HUB_OFFLINE") for m in (hub, ds.config)] + [(ds.config, "HF_DATASETS_OFFLINE")]
        saved = [getattr(m, n) for m, n in switches]
        for m, n in switches:
            setattr(m, n, True)
        try:
            return _pick(ds.load_dataset(name), split, name)
        finally:
            for (m, n), value in zip(switches, saved, strict=True):
                setattr(m, n, value)

    looks_like_name = "/" in name and not name.startswith((".", "/")) and name.count("/") == 1
    if not looks_like_name:
        raise ConfigError(f"{key}: no file or folder at {Path(name).resolve()} ({PATH_RULE})")
    try:
        return _rows(load, name)
    except InputError as exc:
        raise ConfigError(
            f"{key}: {name!r} is neither a file or folder (tried {Path(name).resolve()}; {PATH_RULE}) nor a dataset in "
            f"the local Hugging Face cache ({exc})"
        ) from None


def chat_ids(tokenizer: Any, messages: Sequence[Any], *, generation_prompt: bool) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template (whether transformers returns a list or,
    as since version 5, an encoding)."""
    out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=generation_prompt, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def render_prompt(tokenizer: Any, cfg: DataConfig, prompt: Any) -> tuple[list[int], str]:
    """A prompt's token ids and text as the model sees it: text as it is, or chat messages (``data.chat_template``)
    through the tokenizer's template with the generation prompt (and ``data.system_prompt`` first)."""
    messages = prompt if isinstance(prompt, list) else None
    if messages is None and cfg.chat_template == "always":
        messages = [{"role": "user", "content": str(prompt)}]
    if messages is None:
        return list(tokenizer(str(prompt), add_special_tokens=False)["input_ids"]), str(prompt)
    if cfg.chat_template == "never":
        raise InputError("a prompt is a list of chat messages, but data.chat_template is 'never'; give text prompts")
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            "a prompt is a list of chat messages, but the tokenizer has no chat template; use a chat model's tokenizer "
            "(policy.tokenizer_name), or give text prompts"
        )
    if cfg.system_prompt and not (messages and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": cfg.system_prompt}, *messages]
    ids = chat_ids(tokenizer, messages, generation_prompt=True)
    return ids, str(tokenizer.decode(ids))


def nested(row: Example, dotted: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"``; KeyError naming the path if it is not there."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


def load_split(cfg: DataConfig, split: str, find_task: FindTask) -> list[Example]:
    """The ``train`` or ``val`` examples that ``cfg`` names. A task (``data.task``, the core's or a plugin's, which
    ``find_task`` finds) draws val from another seed, without the prompts training has, so the held-out prompts are
    disjoint from training ones."""
    path = cfg.train_path if split == "train" else cfg.val_path
    key = "data.train_path" if split == "train" else "data.val_path"
    if path:
        rows = load_rows(path, cfg.train_split if split == "train" else cfg.val_split, key)
    elif cfg.task:
        rows = task_rows(cfg, split, find_task)
    elif split == "val":
        return []
    else:
        raise ConfigError(
            "no training data: set data.train_path (a file, a folder, or a dataset in the local Hugging Face cache) "
            "or data.task (a generated task: rl-core plugins lists them)"
        )
    rows = [_mapped(row, cfg, key, number) for number, row in enumerate(rows)]
    if rows and cfg.prompt_key not in rows[0] and "messages" not in rows[0]:
        raise InputError(f"{split} data has no {cfg.prompt_key!r} field (data.prompt_key); fields: {sorted(rows[0])}")
    return rows


def task_rows(cfg: DataConfig, split: str, find_task: FindTask) -> list[Example]:
    """The rows ``data.task`` (``NAME`` or ``NAME:VARIANT``) generates for ``split``."""
    name, sep, variant = str(cfg.task).partition(":")
    try:
        spec = find_task(name)
    except PluginError as exc:
        raise ConfigError(f"data.task: {exc}") from None
    if bool(sep) != spec.variants:
        form = f"'{name}:VARIANT'" if spec.variants else f"{name!r}, without ':{variant}'"
        raise ConfigError(f"data.task: the task {name!r} ({spec.package or 'a plugin'}) is named as {form}")
    options = dict(cfg.task_options)
    train = spec.generate(variant, options, cfg.num_train, cfg.seed)
    if split == "train":
        return train
    seen = {json.dumps(r.get(cfg.prompt_key), sort_keys=True, default=str) for r in train}
    rows = spec.generate(variant, options, cfg.num_val, cfg.seed + 1_000_003)
    unseen = [r for r in rows if json.dumps(r.get(cfg.prompt_key), sort_keys=True, default=str) not in seen]
    if not unseen:
        log.warning(
            "data.task %s: every validation prompt is also a training prompt (the task has few distinct ones), so "
            "validation measures recall of trained prompts, not generalisation; widen the task's settings for a "
            "held-out set",
            cfg.task,
        )
    return unseen or rows


def _mapped(row: Example, cfg: DataConfig, key: str, number: int) -> Example:
    """``row`` with the fields ``data.columns`` names filled from their (nested) keys."""
    if not cfg.columns:
        return row
    out = dict(row)
    for field, dotted in cfg.columns.items():
        try:
            out[field] = nested(row, dotted)
        except KeyError:
            raise InputError(
                f"{key}: row {number} has no {dotted!r} (data.columns.{field}); fields: {sorted(row)}"
            ) from None
    return out


class EpochSampler:
    """Batches of examples in a seeded order, reshuffled each epoch; ``position`` makes it resumable."""

    def __init__(self, rows: Sequence[Example], batch_size: int, seed: int, position: int = 0) -> None:
        if not rows:
            raise InputError("the dataset is empty")
        self.rows, self.batch_size, self.seed, self.position = rows, batch_size, seed, position
        self._shuffled: tuple[int, list[int]] | None = None  # the current epoch's order, shuffled once

    def _order(self, epoch: int) -> list[int]:
        if self._shuffled is None or self._shuffled[0] != epoch:
            order = list(range(len(self.rows)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._shuffled = (epoch, order)
        return self._shuffled[1]

    def next(self) -> list[Example]:
        out = []
        for _ in range(self.batch_size):
            epoch, index = divmod(self.position, len(self.rows))
            out.append(self.rows[self._order(epoch)[index]])
            self.position += 1
        return out

    def __iter__(self) -> Iterator[list[Example]]:
        while True:
            yield self.next()
