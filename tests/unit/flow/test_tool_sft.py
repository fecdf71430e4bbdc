"""The SFT warm start of a tool run: demonstrations trained on their model tokens, validated through the tool loop,
a tokenizer whose merges cover the calls, a cache key that covers the tools and the demonstrations."""

from __future__ import annotations

from pathlib import Path

import pytest

from dockflow.config import load_config
from dockflow.flow import sft as sft_module
from dockflow.flow.sft import SFTInputs, sft_cache_key, sft_warm_start
from dockflow.flow.tool_sft import DemonstrationsError, ToolDemonstrations
from dockflow.models import load_model_and_tokenizer
from dockflow.models.tokenizer import build_task_tokenizer

CALCULATOR = "dockflow.agents.calculator"
TOOL_RUN = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64", "model.tiny.tokenizer_merges=40",
    "data.arithmetic.digits=2", "data.arithmetic.num_train=40", "data.arithmetic.num_labeled=6",
    "data.arithmetic.num_val=4", "data.arithmetic.num_test=4", "data.chat_template=true", "data.prompt_template='{prompt}'",
    "rollout.max_new_tokens=32", "tools.max_total_tokens=96", f"tools.functions=[{CALCULATOR}:calculator]",
    f"sft.demonstrations={CALCULATOR}:demonstration", "sft.max_epochs=1", "sft.eval_every_epochs=1",
]


def _inputs(tmp_path: Path, *extra: str) -> SFTInputs:
    cfg = load_config(None, [*TOOL_RUN, f"sft.cache_dir={tmp_path / 'cache'}", *extra])
    return SFTInputs(cfg.model, cfg.data, cfg.sft, cfg.checkpoint, cfg.run.seed, cfg.rollout.max_new_tokens,
                     cfg.eval.batch_size, cfg.tools)


def test_the_warm_start_trains_on_demonstrations_and_validates_with_the_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scored = []
    real = sft_module.tool_scores

    def spy(model, tokenizer, examples, spec, **kw):
        scored.append(([fn.__name__ for fn in spec.tools], len(examples), kw["max_new_tokens"]))
        return real(model, tokenizer, examples, spec, **kw)

    monkeypatch.setattr(sft_module, "tool_scores", spy)
    result = sft_warm_start(_inputs(tmp_path), tmp_path / "run")
    assert [h["epoch"] for h in result.history] == [0, 1]
    assert scored == [(["calculator"], 4, 32)] * 2  # every validation ran the tool loop with the calculator
    model, tok = load_model_and_tokenizer(result.model_dir)
    assert tok.eos_token == "<|end|>"
    # the merges were also learned from the rendered demonstrations: the call's scaffolding takes fewer tokens
    call = '{"name": "calculator", "arguments": {"a": '
    inputs = _inputs(tmp_path)
    plain = build_task_tokenizer(inputs.data, inputs.seed, inputs.model.tiny.tokenizer_merges)
    assert len(tok.encode(call, add_special_tokens=False)) < len(plain.encode(call, add_special_tokens=False)) / 2


def test_the_cache_key_covers_the_tools_and_the_demonstrations(tmp_path: Path) -> None:
    base = sft_cache_key(_inputs(tmp_path))
    assert sft_cache_key(_inputs(tmp_path, "tools.record_bytes=1024")) == base  # transport only
    for change in ("tools.max_turns=2", "sft.demonstrations=tests.unit.flow.test_tool_sft:rows_own"):
        assert sft_cache_key(_inputs(tmp_path, change)) != base, change


def rows_own(prompt, answer, **row):
    """A demonstrations function that answers without the tool (one assistant turn)."""
    return [{"role": "assistant", "content": answer}]


def test_rows_without_demonstrations_name_the_row_and_the_fix(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, "sft.demonstrations=null")
    from dockflow.data import Example

    with pytest.raises(DemonstrationsError, match="labeled row 0 has no 'completion' column.*set sft.demonstrations"):
        ToolDemonstrations(inputs.data, inputs.tools, None, [Example("What is 1 + 2?", "3")])
    with pytest.raises(DemonstrationsError, match="raised ValueError on labeled row 0: no 'a \\+ b'"):
        ToolDemonstrations(inputs.data, inputs.tools, f"{CALCULATOR}:demonstration", [Example("Hello", "3")])
    own = ToolDemonstrations(inputs.data, inputs.tools, None, [Example("What is 1 + 2?", "3", {"completion": [
        {"role": "assistant", "content": "3"}]})])
    assert own.completions == [[{"role": "assistant", "content": "3"}]]
