"""Prompt templating: ``data.prompt_template`` with a '{prompt}' placeholder wraps every prompt; with
``data.chat_template`` the result becomes a user turn of the tokenizer's chat template (``PromptFormat``).

Only the literal '{prompt}' is replaced, so other braces (``\\boxed{}``, JSON) may appear in a template.

    check_template("Question: {prompt}\\nAnswer:")
    apply_template("Question: {prompt}\\nAnswer:", "What is 2 + 2?")
    PromptFormat.of(cfg.data).render("What is 2 + 2?", tokenizer)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dockflow.config import DataConfig

PLACEHOLDER = "{prompt}"


class TemplateError(ValueError):
    """The prompt template cannot be used; the message says how to fix it."""


def check_template(template: str) -> str:
    """Return ``template`` if it holds exactly one '{prompt}' placeholder, else raise TemplateError."""
    count = template.count(PLACEHOLDER)
    if count != 1:
        what = "has no" if count == 0 else f"has {count}"
        raise TemplateError(
            f"data.prompt_template {template!r} {what} '{PLACEHOLDER}' placeholder; it needs exactly one, "
            f"e.g. 'Question: {PLACEHOLDER}\\nAnswer:'"
        )
    return template


def apply_template(template: str, prompt: str) -> str:
    """The model input for ``prompt``."""
    return check_template(template).replace(PLACEHOLDER, prompt)


@dataclass(frozen=True)
class PromptFormat:
    """How a dataset prompt becomes model input: the prompt template, then optionally the tokenizer's chat template
    (a user turn after an optional system turn, with the generation prompt added), for instruct models.

        fmt = PromptFormat.of(cfg.data)
        fmt.render("What is 2 + 2?", tokenizer)
    """

    template: str = PLACEHOLDER
    chat: bool = False
    system: str | None = None

    @classmethod
    def of(cls, data: DataConfig) -> PromptFormat:
        return cls(check_template(data.prompt_template), data.chat_template, data.system_prompt)

    def render(self, prompt: str, tokenizer: PreTrainedTokenizerBase | None = None) -> str:
        text = apply_template(self.template, prompt)
        if not self.chat:
            return text
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "data.chat_template is true but the model's tokenizer has no chat template: use an instruct model's "
                "tokenizer (tokenizer_config.json 'chat_template'), or set data.chat_template: false"
            )
        turns = [{"role": "system", "content": self.system}] if self.system else []
        turns.append({"role": "user", "content": text})
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)

    def render_all(self, prompts: list[str], tokenizer: PreTrainedTokenizerBase | None = None) -> list[str]:
        return [self.render(p, tokenizer) for p in prompts]
