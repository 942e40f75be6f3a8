"""The model of the tool-agent tests, scripted, and the driver of their episodes (no Ray, no weights: what is under
test is the endpoint and the agent libraries, all of them real)."""

import re

import attrs
from test_agents import Recording

from rl_agents.host import AgentHost
from rl_core.contracts.protocols import Rollout, SamplingParams
from rl_core.testing.episodes import episode_context
from rl_core.training.context import Phases
from rl_core.training.rollouts import generate_and_score

ROWS = [{"prompt": f"Add {a}+{b}.", "answer": str(a + b)} for a, b in ((47, 86), (12, 30))]


class ToolWriter:
    """The model, scripted: asked with no tool result in the chat yet, it calls the calculator (JSON spaced as a
    model writes it, a newline inside the tags as Qwen writes them, which neither a library nor the template
    writes back the same way); after one, it answers with the result."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def generate(self, prompts, params):
        out = []
        for i, ids in enumerate(prompts):
            text = self.tok.decode(ids)
            a, b = re.search(r"Add (\d+)\+(\d+)", text).groups()
            if "<|im_start|>tool" in text:
                reply = f"The sum is {int(a) + int(b)}."
            else:
                reply = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a}+{b}"}}}}\n</tool_call>'
            tokens = [*self.tok(reply, add_special_tokens=False)["input_ids"], self.tok.eos_token_id]
            cut = tokens[: params.max_new_tokens]
            for j in range(params.n):
                out.append(
                    Rollout(
                        prompt_index=i,
                        sample_index=j,
                        prompt_token_ids=tuple(ids),
                        token_ids=tuple(cut),
                        text=self.tok.decode(cut),
                        logprobs=tuple(-0.01 * (k + 1) for k in range(len(cut))),
                        finish_reason="stop" if len(cut) == len(tokens) else "length",
                    )
                )
        return out


def tool_overrides(run_dir, model) -> list[str]:
    """The agent environment over the scripted model: room for a tools prompt in the tiny model's tokens."""
    return [
        f"run_dir={run_dir}",
        "cluster.device=cpu",
        "warmup_recipe=null",
        f"policy.model_name={model}",
        "policy.max_total_sequence_length=2048",
        "environment.name=agent",
        "environment.entry=library_agents:chat_tools",
        "environment.max_turns=4",
        "environment.max_total_tokens=1024",
        "environment.max_tokens_per_turn=200",
        "environment.schedule=lockstep",
        "environment.time_limit_s=60",
    ]


def drive(config, tokenizer, entry, rows=ROWS, params=None, **options):
    """The episodes of ``entry`` over the scripted model, and the engine's recorded calls."""
    env = attrs.evolve(config.environment, options=attrs.evolve(config.environment.options, entry=entry, **options))
    host = AgentHost(env.options)
    ctx = episode_context(attrs.evolve(config, environment=env), Recording(ToolWriter(tokenizer)), tokenizer, host)
    try:
        return generate_and_score(
            ctx, rows, params or SamplingParams(n=2, max_new_tokens=200, seed=1), Phases()
        ), ctx.engine
    finally:
        host.close()
