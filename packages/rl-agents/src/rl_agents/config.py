"""The ``agent`` environment's options: the keys of the ``environment`` section besides the core's."""

from __future__ import annotations

from typing import Literal

import attrs


@attrs.frozen(kw_only=True)
class AgentConfig:
    """An agent program as the environment (``environment: {name: agent, entry: "my_pkg.agent:run"}``). The core's
    keys limit each episode: ``max_turns`` (requests), ``max_total_tokens`` (tokens after the first prompt),
    ``max_tokens_per_turn``; ``schedule`` decides how requests reach the engine."""

    #: ``module:function``, called as ``function(row, client)`` once per episode with the data row and an
    #: ``openai.AsyncOpenAI`` client (an ``openai.OpenAI`` one for a plain function) bound to the episode; it
    #: returns the episode's reward (a number), or None to leave it to ``reward.sources``.
    entry: str = ""
    #: seconds of the agent's own time an episode may take (its waits for the engine, and in lockstep for the other
    #: episodes' agents, not counted); one that overruns ends with ``timeout``.
    time_limit_s: float = attrs.field(default=120.0, validator=attrs.validators.gt(0.0))
    #: an episode whose agent raised or overran: ``zero`` trains on its tokens with reward 0; ``drop`` leaves it
    #: out of the loss.
    on_error: Literal["zero", "drop"] = "zero"
    #: the address the endpoint listens on (``0.0.0.0`` for agents on other machines).
    host: str = "127.0.0.1"
    #: its port; 0: a free one.
    port: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: the template chat requests are rendered with: ``auto`` (the model's own, or the built-in ``chatml-tools``
    #: where the model has none or its own never reads ``tools``), ``model`` (the model's own alone),
    #: ``chatml-tools`` (ChatML with Hermes-style ``<tool_call>`` calls), or a Jinja file's path.
    chat_template: str = "auto"
    #: how tool calls are read from what the model writes: ``auto`` (the tokenizer's ``response_template``, else the
    #: format its chat template writes), ``hermes`` (``<tool_call>{json}</tool_call>``: Hermes, Qwen, chatml-tools),
    #: ``llama3_json``, ``mistral`` (``[TOOL_CALLS]``), or ``none`` (replies are text).
    tool_parser: Literal["auto", "hermes", "llama3_json", "mistral", "none"] = "auto"
