"""An agent episode's calls joined into training samples token for token (``rl_core.training.transcripts``)."""

from types import SimpleNamespace

from rl_core.training.transcripts import Call, episode_rollouts, join_calls

TOKENIZER = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: " ".join(map(str, ids)))


def call(prompt, sampled, finish="stop", version=0):
    return Call(
        prompt_ids=tuple(prompt),
        token_ids=tuple(sampled),
        logprobs=tuple(-0.1 * t for t in sampled),
        finish_reason=finish,
        version=version,
    )


def test_calls_that_extend_the_episode_join_with_the_loss_on_sampled_tokens_only():
    calls = [call([1, 2], [3, 4]), call([1, 2, 3, 4, 9], [5], "length")]
    (sample,) = join_calls(calls)
    assert sample.prompt_ids == [1, 2] and sample.tokens == [3, 4, 9, 5]
    assert sample.sampled == [True, True, False, True], "the agent's token 9 gets no loss"
    assert sample.logprobs == [-0.1 * 3, -0.1 * 4, 0.0, -0.1 * 5]
    assert sample.finish_reason == "length", "the episode's last call decides"


def test_an_edited_history_splits_the_episode_and_a_branch_continues_the_longest_sample():
    calls = [
        call([1, 2], [3]),
        call([1, 7], [8]),  # the history edited: a sample of its own
        call([1, 2, 3, 6], [4]),  # continues the first
        call([1, 7, 8], [5]),  # continues the second
    ]
    rollouts = episode_rollouts(calls, prompt_index=2, sample_index=1, tokenizer=TOKENIZER)
    assert [(r.prompt_token_ids, r.token_ids) for r in rollouts] == [((1, 2), (3, 6, 4)), ((1, 7), (8, 5))]
    assert rollouts[-1].sampled == (True, True), "ordered by their last call: the episode's last sample last"
    assert {(r.prompt_index, r.sample_index) for r in rollouts} == {(2, 1)}
    assert rollouts[0].text == "3 6 4"


def test_a_prompt_shorter_than_a_sample_does_not_continue_it():
    samples = join_calls([call([1, 2, 3], [4]), call([1, 2], [5])])
    assert [s.prompt_ids for s in samples] == [[1, 2, 3], [1, 2]]
