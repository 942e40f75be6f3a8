"""The reward model's pairs as ``reward_model`` encodes them: ``prompt + separator + response`` through the
tokenizer, read at each row's last token, with each pair's own ``margin`` or the configured one."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from rl_core.algorithms.reward_model import RewardModelConfig, encode_scored_pairs
from rl_core.base.errors import InputError
from rl_core.data.tiny_models import ensure_tiny_model


@pytest.fixture(scope="module")
def ctx():
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model("qwen2-tiny"))
    config = SimpleNamespace(
        data=SimpleNamespace(prompt_key="prompt"), policy=SimpleNamespace(max_total_sequence_length=64)
    )
    return SimpleNamespace(tokenizer=tokenizer, config=config)


def test_each_side_is_prompt_separator_response_read_at_its_last_token_with_its_pairs_margin(ctx):
    rows = [
        {"prompt": "what is 2 + 2", "chosen": "4", "rejected": "it is five", "margin": 2.0},
        {"prompt": "say yes", "chosen": "yes", "rejected": "no"},
    ]
    cfg = RewardModelConfig(separator="\nanswer: ", margin=0.5)
    batch = encode_scored_pairs(ctx, rows, cfg)
    tok = ctx.tokenizer
    texts = [
        "what is 2 + 2\nanswer: 4",
        "what is 2 + 2\nanswer: it is five",
        "say yes\nanswer: yes",
        "say yes\nanswer: no",
    ]
    for i, text in enumerate(texts):
        ids = tok(text)["input_ids"]
        assert batch["input_ids"][i, : len(ids)].tolist() == ids and int(batch["attention_mask"][i].sum()) == len(ids)
        assert batch["loss_mask"][i].nonzero().flatten().tolist() == [len(ids) - 1]
    assert torch.equal(batch["margin"], torch.tensor([2.0, 2.0, 0.5, 0.5]))


def test_a_pair_without_a_rejected_side_names_the_fields_it_needs(ctx):
    with pytest.raises(InputError, match="'chosen' and 'rejected'; fields are \\['chosen', 'prompt'\\]"):
        encode_scored_pairs(ctx, [{"prompt": "p", "chosen": "c"}], RewardModelConfig())
