"""The chat template the endpoint renders requests with (``environment.chat_template``): the model's own, a file,
or the built-in ``chatml-tools`` (ChatML with Hermes-style tool calls, each turn closed by the tokenizer's end-of-text
token so that a turn the model ends is the turn the template writes; tools listed as signatures,
``name(arg: type, ...): description``, short enough for a small model's context). ``auto`` takes the model's own unless it
cannot render the request (it has none, or tools are offered and it never reads ``tools``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rl_core.api import ConfigError

log = logging.getLogger(__name__)

CHATML_TOOLS = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- 'Tools:' }}
{%- for tool in tools %}
{%- set f = tool.function %}
{{- '\\n' + f.name + '(' }}
{%- for name, p in ((f.parameters or {}).properties or {}).items() %}
{{- (', ' if not loop.first else '') + name + ': ' + (p.type if p.type is string else 'any') }}
{%- endfor %}
{{- ')' + (': ' + f.description if f.description else '') }}
{%- endfor %}
{{- '\\nCall: <tool_call>{"name": ..., "arguments": {...}}</tool_call>' + eos_token + '\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + eos_token + '\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{{- '<tool_call>' + ({'name': call.function.name, 'arguments': call.function.arguments} | tojson) + '</tool_call>' }}
{%- endfor %}
{{- eos_token + '\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + eos_token + '\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

BUILT_IN = {"chatml-tools": CHATML_TOOLS}


def load_template(setting: str) -> str | None:
    """The template ``environment.chat_template`` names (None: the model's own, ``auto`` or ``model``)."""
    if setting in ("auto", "model"):
        return None
    if setting in BUILT_IN:
        return BUILT_IN[setting]
    path = Path(setting)
    if not path.is_file():
        raise ConfigError(
            f"environment.chat_template: {setting!r} is neither a file nor a built-in template "
            f"({', '.join(['auto', 'model', *BUILT_IN])})"
        )
    return path.read_text()


class Templates:
    """Which template renders a request, the choice logged once per reason."""

    def __init__(self, setting: str, tokenizer: Any) -> None:
        self.setting, self.fixed = setting, load_template(setting)
        self.own: str | None = getattr(tokenizer, "chat_template", None) or None
        self.said: set[str] = set()

    def pick(self, tools: bool) -> str:
        if self.fixed is not None:
            return self.fixed
        if self.own is not None and (self.setting == "model" or not tools or "tools" in self.own):
            return self.own
        if self.setting == "model":
            raise ValueError("the model's tokenizer has no chat template (environment.chat_template: model)")
        reason = "has no chat template" if self.own is None else "has a chat template that never reads `tools`"
        if reason not in self.said:
            self.said.add(reason)
            log.warning(
                "agent endpoint: the model %s: rendering with the built-in 'chatml-tools' template "
                "(environment.chat_template names another, or 'model' to refuse such requests)",
                reason,
            )
        return CHATML_TOOLS
