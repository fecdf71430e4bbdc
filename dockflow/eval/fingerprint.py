"""The identity of a held-out evaluation: what a score was measured on, so that only like is ranked with like.

    ident = eval_identity(task.test[:500], EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed),
                          tokenizer)
    ident.fingerprint    # "9c0e..." (16 hex), the same for two evaluations exactly when every field is the same
    ident.fields()       # {"test_set": "3f1c...", "num_prompts": "500", "verifier": "math_verify", ...}

Fields: the content hash of the examples actually scored (prompt and reference answer of each, in order), their
number, the task's verifier, the settings of generation that change a score (``max_new_tokens``; greedy always;
pass@k's k, temperature, top_p and seed only when ``eval.pass_k > 1``), the prompt template, and with
``data.chat_template`` the system prompt and a hash of the tokenizer's chat template; with ``tools:``, the tools and
the tool loop's limits. ``eval.batch_size`` and
the model's dtype are not in it: they decide how fast, not what is measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from transformers import PreTrainedTokenizerBase

from dockflow.data import Example
from dockflow.data.task_identity import examples_hash, short_hash
from dockflow.eval.policy import EvalInputs
from dockflow.rewards.verifier import verifier_name


@dataclass(frozen=True)
class EvalIdentity:
    """What one evaluation measured (see the module doc); ``fingerprint`` hashes every other field."""

    test_set: str
    num_prompts: int
    verifier: str
    max_new_tokens: int
    decoding: str  # "greedy", or "greedy + pass@k temperature=.. top_p=.. seed=.."
    prompt_template: str
    chat_template: str  # "off", or the hash of the tokenizer's chat template
    system_prompt: str  # "" without a chat template
    fingerprint: str
    tools: str = "off"  # or the tools' paths and the loop's limits; in the fingerprint only when not "off"

    def fields(self) -> dict[str, str]:
        """Every field but the fingerprint, as text (MLflow tag values)."""
        return {k: str(v) for k, v in asdict(self).items() if k != "fingerprint"}


def _decoding(inputs: EvalInputs) -> str:
    ev = inputs.eval
    if ev.pass_k <= 1:
        return "greedy"
    return f"greedy + pass@{ev.pass_k} temperature={ev.temperature:g} top_p={ev.top_p:g} seed={inputs.seed}"


def _chat_template(inputs: EvalInputs, tokenizer: PreTrainedTokenizerBase | None) -> str:
    if not inputs.data.chat_template:
        return "off"
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if not template:
        return "missing"  # rendering will fail with TemplateError; the identity still says what was asked
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return short_hash([text])


def eval_identity(
    examples: Sequence[Example], inputs: EvalInputs, tokenizer: PreTrainedTokenizerBase | None = None
) -> EvalIdentity:
    """The identity of scoring ``examples`` with ``inputs`` (``tokenizer``: the model's, for its chat template)."""
    chat = _chat_template(inputs, tokenizer)
    fields = {
        "test_set": examples_hash(examples),
        "num_prompts": len(examples),
        "verifier": verifier_name(inputs.data),
        "max_new_tokens": inputs.max_new_tokens,
        "decoding": _decoding(inputs),
        "prompt_template": inputs.data.prompt_template,
        "chat_template": chat,
        "system_prompt": (inputs.data.system_prompt or "") if chat != "off" else "",
    }
    if inputs.tools.enabled:  # scored through the tool loop (an evaluation without tools keeps its fingerprint)
        fields["tools"] = _tools(inputs)
    fingerprint = short_hash(f"{k}={v}" for k, v in sorted(fields.items()))
    return EvalIdentity(**fields, fingerprint=fingerprint)


def _tools(inputs: EvalInputs) -> str:
    """What of the ``tools:`` section changes a score: the tools and environments, and the loop's limits."""
    tc = inputs.tools
    return json.dumps(tc.model_dump(exclude={"record_bytes"}), sort_keys=True)
