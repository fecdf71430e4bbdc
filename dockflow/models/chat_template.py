"""The tiny tokenizer's chat template (``data.chat_template: true``): role tokens, Qwen-style tools.

Each turn is a role token, its text and ``<|end|>``; a tool run's tokenizer also has ``<|end|>`` as its EOS (as
Qwen's instruct tokenizers end every turn with ``<|im_end|>``, their EOS), so a model turn ends exactly where the
template ends it, and the tool tokens (``with_chat_template``). With ``tools=`` (``apply_chat_template(messages, tools=schemas)``, the JSON schemas of
``transformers.utils.get_json_schema``) the template lists the tools in the system turn, one signature each
(name, parameters with their JSON types, ``?`` after an optional one, the description: a tiny model's context
is short, so not the whole schema), and renders calls and results in Qwen2.5's format, which
``dockflow.agents.parse`` reads::

    <|system|><tools>calculator(a: integer, op: string, b: integer): Add or subtract two integers.</tools><|end|>
    <|user|>What is 347 + 582?<|end|>
    <|assistant|><tool_call>{"name": "calculator", "arguments": {"a": 347, "op": "+", "b": 582}}</tool_call><|end|>
    <|user|><tool_response>929</tool_response><|end|>
    <|assistant|>929<|end|>

(newlines between turns added here for reading; the template writes none). A system message comes first in the
system turn, before the tools. Consecutive tool results share one user turn, as in Qwen2.5. Conversations
without tools render exactly as before tools existed. The assistant turns are wrapped in ``{% generation %}``
markers (``return_assistant_tokens_mask``). It is prefix preserving (an assistant turn renders the same
whatever follows it), which the tool loop needs to append tool turns to sampled ids
(``dockflow.agents.trajectory.tool_suffix_ids``); tested with TRL's own checks.
"""

from __future__ import annotations

CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
# Single tokens, not special (decoding keeps them, so a decoded turn still shows its calls), as in Qwen2.5.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
END_OF_TURN = "<|end|>"
TINY_CHAT_VERSION = 1  # of the tool run's tiny chat tokenizer and template (in the SFT cache key of tool runs)

TINY_CHAT_TEMPLATE = (
    "{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' else none -%}"
    "{%- if tools -%}"
    "<|system|>{% if sys %}{{ sys }}\n{% endif %}<tools>"
    "{%- for tool in tools -%}"
    "{%- set f = tool['function'] if tool['function'] is defined else tool -%}"
    "{%- set params = f['parameters'] if f['parameters'] is defined else {} -%}"
    "{%- set required = params['required'] if params['required'] is defined else [] -%}"
    "{{ '\\n' if not loop.first }}{{ f['name'] }}("
    "{%- for name, p in (params['properties'] if params['properties'] is defined else {}).items() -%}"
    "{{ ', ' if not loop.first }}{{ name }}{{ '' if name in required else '?' }}: {{ p['type'] }}"
    "{%- endfor -%}"
    "){% if f['description'] is defined %}: {{ f['description'] }}{% endif %}"
    "{%- endfor -%}"
    "</tools><|end|>"
    "{%- elif sys is not none -%}<|system|>{{ sys }}<|end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if loop.first and sys is not none -%}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|user|>{% endif -%}"
    "<tool_response>{{ m['content'] }}</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|end|>{% endif -%}"
    "{%- elif m['role'] == 'assistant' -%}"
    "<|assistant|>{% generation %}{{ m['content'] or '' }}"
    "{%- for call in m.get('tool_calls') or [] -%}"
    "{%- set f = call['function'] if call['function'] is defined else call -%}"
    '<tool_call>{"name": "{{ f[\'name\'] }}", "arguments": '
    "{{ f['arguments'] if f['arguments'] is string else f['arguments'] | tojson }}}</tool_call>"
    "{%- endfor -%}<|end|>{% endgeneration %}"
    "{%- else -%}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}"
)
