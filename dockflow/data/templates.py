"""Prompt templating: ``data.prompt_template`` with a '{prompt}' placeholder wraps every prompt.

Only the literal '{prompt}' is replaced, so other braces (``\\boxed{}``, JSON) may appear in a template.

    check_template("Question: {prompt}\\nAnswer:")
    apply_template("Question: {prompt}\\nAnswer:", "What is 2 + 2?")
"""

from __future__ import annotations

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
