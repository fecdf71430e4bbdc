"""reasoning-gym's scorer as a reward function and as the verifier: right, wrong, malformed, hostile answers."""

from __future__ import annotations

import time

import pytest

from dockflow.config.data import ReasoningGymConfig
from dockflow.config.reward import RewardFunctionConfig
from dockflow.data import Example
from dockflow.data.reasoning_gym import countdown_prompt, generate_reasoning_gym
from dockflow.rewards.functions import function_path, import_function
from dockflow.rewards.reasoning_gym_scorer import (
    extract_answer,
    reasoning_gym_score,
    safe_answer,
    verify_example,
)

META = {"source_dataset": "countdown", "source_index": 0, "numbers": [4, 10, 7], "target": 47,
        "expression": "10*4 + 7"}
EX = Example(prompt=countdown_prompt([4, 10, 7], 47), answer="10*4+7", fields={"metadata": META})


def _score(completion: str) -> float:
    (value,) = reasoning_gym_score([EX.prompt], [completion], metadata=[META])
    return value


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("10*4+7", 1.0),
        ("7+4*10", 1.0),  # any solution, not only the reference
        ("(10 * 4) + 7", 1.0),
        ("10*4+7\n3+3", 1.0),  # the first line is the answer; the rest is the tiny model's junk
        ("<answer>4*10+7</answer>", 1.0),  # reasoning-gym's own answer tags
        ("10*4-7", 0.05),  # well formed, wrong value: the scorer's partial credit
        ("10*4+7+1", 0.05),  # right value needs exactly the given numbers
        ("10*4", 0.05),
        ("10*4+", 0.01),  # malformed
        ("", 0.01),
        ("forty-seven", 0.01),
        ("1/0", 0.01),
    ],
)
def test_scores_as_reasoning_gym_does(completion: str, reward: float) -> None:
    assert _score(completion) == pytest.approx(reward)
    assert verify_example(completion, EX) == (1.0 if reward == 1.0 else 0.0)


@pytest.mark.parametrize(
    "completion",
    ["9**9**9", "9 ** 9 ** 9", "<answer>9**9**9</answer>", "__import__('os').system('touch /tmp/x')",
     "9" * 70, "(" * 500 + "1" + ")" * 500],
)
def test_hostile_answers_never_reach_the_scorer_and_return_at_once(completion: str) -> None:
    start = time.perf_counter()
    assert _score(completion) == pytest.approx(0.01)
    assert verify_example(completion, EX) == 0.0
    assert time.perf_counter() - start < 1.0
    assert safe_answer("countdown", extract_answer(completion)) is None


def test_metadata_passes_through_per_completion_and_other_columns_are_ignored() -> None:
    data = generate_reasoning_gym(ReasoningGymConfig(num_train=20, num_labeled=5, num_val=5, num_test=10), 0)
    rows = data.test
    prompts = [ex.prompt for ex in rows]
    rewards = reasoning_gym_score(
        prompts, [ex.answer for ex in rows], metadata=[ex.fields["metadata"] for ex in rows],
        answer=[ex.answer for ex in rows], completion_ids=[[1]] * len(rows), trainer_state={"global_step": 0},
    )
    assert rewards == [1.0] * len(rows)
    shifted = reasoning_gym_score(prompts, [ex.answer for ex in rows[1:] + rows[:1]],
                                  metadata=[ex.fields["metadata"] for ex in rows])
    assert max(shifted) < 1.0  # each completion is scored against its own row


def test_a_row_without_metadata_is_not_applicable() -> None:
    assert reasoning_gym_score(["p", "q"], ["10*4+7", "1"], metadata=[META, None]) == [1.0, None]
    with pytest.raises(ValueError, match="no reasoning-gym metadata"):
        verify_example("1", Example("p", "1"))


def test_builtin_name_resolves_to_this_function() -> None:
    fn = import_function(function_path(RewardFunctionConfig(name="reasoning_gym")))
    assert fn is reasoning_gym_score
