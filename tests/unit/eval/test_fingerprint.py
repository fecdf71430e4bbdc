"""The identity of an evaluation and of a task: what changes a score changes the fingerprint, nothing else does."""

from __future__ import annotations

from dockflow.config import load_config
from dockflow.config.data import DataConfig
from dockflow.config.sections import EvalConfig, ModelConfig
from dockflow.data import Example, load_task
from dockflow.data.task_identity import examples_hash, task_identity
from dockflow.eval import EvalInputs
from dockflow.eval.fingerprint import eval_identity
from dockflow.models.base_model_identity import base_model_identity
from dockflow.models.tokenizer import build_char_tokenizer

CONFIG = "configs/grpo_arith.yaml"


def _fp(examples: list[Example], inputs: EvalInputs, tokenizer=None) -> str:
    return eval_identity(examples, inputs, tokenizer).fingerprint


def test_what_changes_a_score_changes_the_fingerprint() -> None:
    cfg = load_config(CONFIG)
    test = load_task(cfg.data, cfg.run.seed).test
    inputs = EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed)
    base = eval_identity(test[:100], inputs)
    assert base.num_prompts == 100 and base.verifier == "math_verify" and base.decoding == "greedy"
    assert base.chat_template == "off" and base.system_prompt == "" and len(base.fingerprint) == 16
    assert base.fields()["num_prompts"] == "100" and "fingerprint" not in base.fields()
    assert eval_identity(list(test[:100]), inputs) == base  # deterministic, a pure function of what is scored

    changed = {
        "num_prompts": _fp(test[:99], inputs),
        "test content": _fp([Example(test[0].prompt, "12345"), *test[1:100]], inputs),
        "order": _fp([test[1], test[0], *test[2:100]], inputs),
        "max_new_tokens": _fp(test[:100], EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens + 1, cfg.run.seed)),
        "template": _fp(test[:100], EvalInputs(cfg.eval, cfg.data.model_copy(update={"prompt_template": "Q: {prompt}\nA: "}),
                                               cfg.rollout.max_new_tokens, cfg.run.seed)),
        "dataset seed": _fp(load_task(cfg.data, cfg.run.seed + 1).test[:100], inputs),
        "verifier": _fp(test[:100], EvalInputs(cfg.eval, cfg.data.model_copy(update={"source": "reasoning_gym"}),
                                               cfg.rollout.max_new_tokens, cfg.run.seed)),
        "pass_k": _fp(test[:100], EvalInputs(cfg.eval.model_copy(update={"pass_k": 4}), cfg.data,
                                             cfg.rollout.max_new_tokens, cfg.run.seed)),
    }
    assert base.fingerprint not in changed.values(), changed
    assert len(set(changed.values())) == len(changed)

    # what does not change the measurement: the train order, the batch size, and the pass@k settings while
    # pass_k is 1 (no samples are drawn)
    shuffled = cfg.data.model_copy(update={"shuffle_seed": 7})
    same = [
        _fp(load_task(shuffled, cfg.run.seed).test[:100], EvalInputs(cfg.eval, shuffled, cfg.rollout.max_new_tokens, cfg.run.seed)),
        _fp(test[:100], EvalInputs(cfg.eval.model_copy(update={"batch_size": 7}), cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed)),
        _fp(test[:100], EvalInputs(cfg.eval.model_copy(update={"temperature": 0.5}), cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed + 1)),
    ]  # fmt: skip
    assert same == [base.fingerprint] * 3
    k4 = EvalConfig(pass_k=4)
    sampled = eval_identity(test[:100], EvalInputs(k4, cfg.data, 8, 0))
    assert sampled.decoding == "greedy + pass@4 temperature=1 top_p=1 seed=0"
    assert _fp(test[:100], EvalInputs(k4, cfg.data, 8, 1)) != sampled.fingerprint  # the samples' seed counts now


def test_chat_template_and_system_prompt_count_only_with_the_chat_template() -> None:
    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    ex = [Example("1 + 1", "2")]
    plain = DataConfig(system_prompt="be brief")
    chat = DataConfig(chat_template=True, system_prompt="be brief")
    off = eval_identity(ex, EvalInputs(EvalConfig(), plain, 8, 0), tok)
    assert (off.chat_template, off.system_prompt) == ("off", "")
    assert off.fingerprint == eval_identity(ex, EvalInputs(EvalConfig(), DataConfig(), 8, 0), tok).fingerprint
    on = eval_identity(ex, EvalInputs(EvalConfig(), chat, 8, 0), tok)
    assert on.system_prompt == "be brief" and len(on.chat_template) == 16 and on.fingerprint != off.fingerprint
    other = chat.model_copy(update={"system_prompt": "think"})
    assert eval_identity(ex, EvalInputs(EvalConfig(), other, 8, 0), tok).fingerprint != on.fingerprint
    tok.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    assert eval_identity(ex, EvalInputs(EvalConfig(), chat, 8, 0), tok).chat_template != on.chat_template


def test_task_and_base_model_identity() -> None:
    cfg = load_config(CONFIG)
    rows = [Example("a", "1"), Example("b", "2")]
    assert task_identity(cfg.data, rows) == "arithmetic digits=2 ops=+-"
    assert task_identity(cfg.data.model_copy(update={"shuffle_seed": 3}), []) == "arithmetic digits=2 ops=+-"
    three = cfg.data.model_copy(update={"arithmetic": cfg.data.arithmetic.model_copy(update={"digits": 3})})
    assert task_identity(three, rows) == "arithmetic digits=3 ops=+-"
    files = DataConfig(source="file", train_path="x.jsonl", test_path="y.jsonl")
    assert task_identity(files, rows) == f"file train={examples_hash(rows)}"
    assert task_identity(files, rows[:1]) != task_identity(files, rows)
    rg = DataConfig(source="reasoning_gym")
    assert task_identity(rg, []).startswith("reasoning_gym countdown options=")
    assert task_identity(rg, []) != task_identity(DataConfig(source="reasoning_gym", reasoning_gym={"options": {}}), [])

    assert base_model_identity(ModelConfig(path="/models/qwen")) == "path /models/qwen"
    tiny = base_model_identity(cfg.model)
    assert tiny.startswith("tiny qwen2 hidden=128 layers=4")
    assert base_model_identity(ModelConfig(tiny={"hidden_size": 64})) != tiny


def test_tools_enter_the_fingerprint_only_when_the_run_has_them() -> None:
    from dockflow.config.tools import ToolsConfig

    ex = [Example("What is 1 + 2?", "3")]
    plain = EvalInputs(EvalConfig(), DataConfig(), 8, 0)
    assert eval_identity(ex, EvalInputs(EvalConfig(), DataConfig(), 8, 0, ToolsConfig())) == eval_identity(ex, plain)
    calc = ToolsConfig(functions=["dockflow.agents.calculator:calculator"])
    with_tools = eval_identity(ex, EvalInputs(EvalConfig(), DataConfig(), 8, 0, calc))
    assert with_tools.fingerprint != eval_identity(ex, plain).fingerprint and "calculator" in with_tools.tools
    other = EvalInputs(EvalConfig(), DataConfig(), 8, 0, calc.model_copy(update={"max_turns": 2}))
    assert eval_identity(ex, other).fingerprint != with_tools.fingerprint  # the loop's limits change a score
    same = EvalInputs(EvalConfig(), DataConfig(), 8, 0, calc.model_copy(update={"record_bytes": 1024}))
    assert eval_identity(ex, same).fingerprint == with_tools.fingerprint  # the record's size does not
