"""Prompt templating: ``data.prompt_template`` with a '{prompt}' placeholder wraps every prompt; with
``data.chat_template`` the result becomes a user turn of the tokenizer's chat template (``PromptFormat``). A
conversational prompt (a list of messages) goes to the chat template as it is: no prompt template, and
``data.chat_template`` must be true (``check_conversational``).

Only the literal '{prompt}' is replaced, so other braces (``\\boxed{}``, JSON) may appear in a template.

    check_template("Question: {prompt}\\nAnswer:")
    apply_template("Question: {prompt}\\nAnswer:", "What is 2 + 2?")
    PromptFormat.of(cfg.data).render("What is 2 + 2?", tokenizer)
    PromptFormat.of(cfg.data).render([{"role": "user", "content": "What is 2 + 2?"}], tokenizer)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dockflow.data.messages import Prompt, is_conversational

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
    (a user turn after an optional system turn, with the generation prompt added), for instruct models. A list of
    messages skips the prompt template: the system turn (if any, and the messages have none) then the messages go
    to the chat template, with the generation prompt added.

        fmt = PromptFormat.of(cfg.data)
        fmt.render("What is 2 + 2?", tokenizer)
    """

    template: str = PLACEHOLDER
    chat: bool = False
    system: str | None = None

    @classmethod
    def of(cls, data: DataConfig) -> PromptFormat:
        return cls(check_template(data.prompt_template), data.chat_template, data.system_prompt)

    def render(self, prompt: Prompt, tokenizer: PreTrainedTokenizerBase | None = None) -> str:
        conversational = is_conversational(prompt)
        if conversational and not self.chat:
            raise TemplateError(_NEEDS_CHAT)
        if not self.chat:
            return apply_template(self.template, prompt)
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            fix = "or use string prompts" if conversational else "or set data.chat_template: false"
            raise TemplateError(
                "data.chat_template is true but the model's tokenizer has no chat template: use an instruct model's "
                f"tokenizer (tokenizer_config.json 'chat_template'), {fix}"
            )
        return tokenizer.apply_chat_template(self.messages(prompt), tokenize=False, add_generation_prompt=True)

    def messages(self, prompt: Prompt) -> list[dict[str, Any]]:
        """The turns the chat template renders for ``prompt``: the system turn (if any), then the user turn or the
        row's own messages (the tool loop renders them itself, with the tools' schemas)."""
        turns = [{"role": "system", "content": self.system}] if self.system else []
        if is_conversational(prompt):
            return [*(turns if prompt[0]["role"] != "system" else []), *prompt]  # the row's own system turn wins
        return [*turns, {"role": "user", "content": apply_template(self.template, prompt)}]

    def render_all(self, prompts: list[Prompt], tokenizer: PreTrainedTokenizerBase | None = None) -> list[str]:
        return [self.render(p, tokenizer) for p in prompts]


_NEEDS_CHAT = ("the prompts are conversational (lists of messages), which only the tokenizer's chat template can "
               "render: set data.chat_template: true (with a tokenizer that has one)")


def check_conversational(where: str, template: str, chat: bool, default_template: str) -> None:
    """A TemplateError unless conversational prompts (those of ``where``) can be rendered: ``data.chat_template``
    true, and ``data.prompt_template`` left at its default (or '{prompt}'), since messages go to the chat template
    as they are and any other template would be silently ignored."""
    if not chat:
        raise TemplateError(f"{where}: {_NEEDS_CHAT}")
    if template not in (default_template, PLACEHOLDER):
        raise TemplateError(
            f"{where}: the prompts are conversational (lists of messages), which go to the chat template as they "
            f"are, so data.prompt_template {template!r} would be ignored: remove it, or put its text in the messages"
        )
