"""The length policy: a prompt over data.max_prompt_tokens, or prompt + rollout.max_new_tokens over the model's
context, is refused in one line naming the prompt and the fix."""

import pytest

from dockflow.data.length_policy import LengthPolicyError, check_prompt_lengths
from dockflow.models import build_char_tokenizer

PROMPTS = ["What is 1 + 1?", "What is 12 + 345?", "Hi"]  # 14, 17 and 2 characters: one token each


def test_prompts_within_the_limits_pass_and_the_longest_is_returned():
    assert check_prompt_lengths(PROMPTS, build_char_tokenizer(), 17, 8, 25) == 17


def test_a_prompt_over_max_prompt_tokens_is_named():
    with pytest.raises(LengthPolicyError, match=r"train prompt 1 has 17 tokens, over data.max_prompt_tokens=16 "
                                                r"\(1 of 3 prompts are\)"):
        check_prompt_lengths(PROMPTS, build_char_tokenizer(), 16, 8, None)


def test_prompt_and_new_tokens_over_the_context_are_named():
    with pytest.raises(LengthPolicyError, match=r"train prompt 1 has 17 tokens; with rollout.max_new_tokens=2048 it "
                                                r"needs 2065 positions, over the model's context of 2048"):
        check_prompt_lengths(PROMPTS, build_char_tokenizer(), None, 2048, 2048)
