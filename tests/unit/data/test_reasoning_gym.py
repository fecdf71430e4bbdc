"""reasoning-gym tasks: determinism, disjoint splits, short prompts that fit the tiny model, metadata rows."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest

from dockflow.config import DataConfig, load_config
from dockflow.config.data import ReasoningGymConfig
from dockflow.data import apply_template, load_task
from dockflow.data.reasoning_gym import generate_reasoning_gym, left_to_right_solution
from dockflow.rewards.reasoning_gym_scorer import verify_example

ROOT = Path(__file__).resolve().parents[3]
PROMPT = re.compile(r"Make (\d+) from (\d+(?: \d+)*)\.")
SMALL = ReasoningGymConfig(num_train=300, num_labeled=50, num_val=40, num_test=60)


def _key(prompt: str) -> tuple[int, tuple[int, ...]]:
    m = PROMPT.fullmatch(prompt)
    assert m, prompt
    return int(m[1]), tuple(sorted(int(n) for n in m[2].split()))


def test_same_seed_same_splits_other_seed_differs() -> None:
    a, b, c = generate_reasoning_gym(SMALL, 1), generate_reasoning_gym(SMALL, 1), generate_reasoning_gym(SMALL, 2)
    assert a == b
    assert a.test != c.test and a.train != c.train


def test_splits_are_disjoint_problems_and_labeled_is_train_prefix() -> None:
    data = load_task(DataConfig(source="reasoning_gym", reasoning_gym=SMALL), seed=0)
    assert (len(data.train), len(data.labeled), len(data.val), len(data.test)) == (300, 50, 40, 60)
    train, val, test = ({_key(e.prompt) for e in split} for split in (data.train, data.val, data.test))
    assert not (train & test) and not (train & val) and not (val & test)
    assert len(test) == 60 and len(val) == 40 and len(train) == 300
    assert data.labeled == data.train[:50]


def test_test_split_does_not_move_when_other_sizes_change() -> None:
    large = ReasoningGymConfig(num_train=900, num_labeled=400, num_val=40, num_test=60)
    assert generate_reasoning_gym(SMALL, 3).test == generate_reasoning_gym(large, 3).test


def test_prompts_answers_and_metadata_agree_and_the_reference_solves_each() -> None:
    data = generate_reasoning_gym(SMALL, 0)
    for ex in data.train + data.val + data.test:
        target, numbers = _key(ex.prompt)
        meta = ex.fields["metadata"]
        assert meta["source_dataset"] == "countdown" and meta["target"] == target
        assert tuple(sorted(meta["numbers"])) == numbers and len(numbers) == 3
        assert all(1 <= n <= 50 for n in numbers) and 1 <= target <= 100
        assert " " not in ex.answer
        assert verify_example(ex.answer, ex) == 1.0
    meta = data.test[0].fields["metadata"]
    assert json.loads(json.dumps(meta)) == meta  # plain JSON types: no tuples
    assert pickle.loads(pickle.dumps(data.test[0])) == data.test[0]


def test_generator_options_pass_through() -> None:
    cfg = SMALL.model_copy(update={"options": {"min_numbers": 4, "max_numbers": 4, "min_value": 1, "max_value": 9,
                                               "min_target": 5, "max_target": 30, "operators": ["+", "-"]}})
    for ex in generate_reasoning_gym(cfg, 0).test:
        target, numbers = _key(ex.prompt)
        assert len(numbers) == 4 and max(numbers) <= 9 and 5 <= target <= 30
        assert set(re.sub(r"[\d()]", "", ex.answer)) <= {"+", "-"}


@pytest.mark.parametrize(
    ("numbers", "target", "solution"),
    [([10, 4, 7], 47, "10*4+7"), ([3, 5, 2], 16, "(3+5)*2"), ([3, 5, 2], -4, "3-5-2"), ([6, 3, 2], 4, "6/3+2"),
     ([1, 2, 3, 4], 36, "(1+2)*3*4"), ([8, 2, 7], 2, None), ([1, 2], 5, None)],
)
def test_reference_is_the_first_left_to_right_solution_in_prompt_order(numbers, target, solution) -> None:
    assert left_to_right_solution(numbers, target) == solution


def test_full_prompt_is_reasoning_gyms_question() -> None:
    ex = generate_reasoning_gym(SMALL.model_copy(update={"short_prompt": False}), 0).test[0]
    assert "Final answer format instructions" in ex.prompt and verify_example(ex.answer, ex) == 1.0


def test_a_small_problem_space_repeats_train_problems_or_says_what_to_change() -> None:
    tiny_space = {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 3, "min_target": 1,
                  "max_target": 9}
    cfg = ReasoningGymConfig(options=tiny_space, num_train=50, num_labeled=5, num_val=2, num_test=5)
    data = generate_reasoning_gym(cfg, 0)
    assert len(data.train) == 50 and len({e.prompt for e in data.train}) < 50
    assert not {_key(e.prompt) for e in data.train} & {_key(e.prompt) for e in data.test}
    with pytest.raises(ValueError, match="distinct problems .* lower the sizes"):
        generate_reasoning_gym(cfg.model_copy(update={"num_test": 40}), 0)


def test_bad_generator_options_name_the_section() -> None:
    with pytest.raises(ValueError, match="data.reasoning_gym: reasoning-gym cannot build 'countdown'"):
        generate_reasoning_gym(SMALL.model_copy(update={"options": {"min_numbers": 1}}), 0)
    with pytest.raises(ValueError, match="num_labeled=400 exceeds num_train=300"):
        generate_reasoning_gym(SMALL.model_copy(update={"num_labeled": 400}), 0)


def test_countdown_config_prompts_fit_the_tiny_models_context() -> None:
    from dockflow.models.tokenizer import build_task_tokenizer

    cfg = load_config(ROOT / "configs" / "grpo_countdown.yaml", ["data.reasoning_gym.num_train=2000"])  # faster
    tok = build_task_tokenizer(cfg.data, cfg.run.seed, cfg.model.tiny.tokenizer_merges)
    task = load_task(cfg.data, cfg.run.seed)
    longest = max(len(tok(apply_template(cfg.data.prompt_template, ex.prompt))["input_ids"])
                  for ex in task.train + task.test)
    assert longest + cfg.rollout.max_new_tokens <= cfg.model.tiny.max_position_embeddings
    answers = max(len(tok(ex.answer, add_special_tokens=False)["input_ids"]) for ex in task.labeled)
    assert answers + 1 <= cfg.rollout.max_new_tokens  # the reference solution and EOS fit the response budget
