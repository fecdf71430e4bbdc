"""The length policy: a prompt over data.max_prompt_tokens is refused in one line naming it, or left out of the
prompt order with the count logged (data.overlong_prompts=filter); the longest prompt kept plus
rollout.max_new_tokens over the model's context is refused in one line."""

import logging

import pytest

from dockflow.config import Config
from dockflow.config.data import DataConfig
from dockflow.data.length_policy import LengthPolicyError, check_prompt_lengths
from dockflow.data.prompt_order import PromptSampler
from dockflow.models import build_char_tokenizer, build_tiny_model, save_pretrained_dir
from dockflow.rollout.prompts import overlong_train_prompts

PROMPTS = ["What is 1 + 1?", "What is 12 + 345?", "Hi"]  # 14, 17 and 2 characters: one token each


def data(limit: int | None, mode: str = "refuse") -> DataConfig:
    return DataConfig(max_prompt_tokens=limit, overlong_prompts=mode)


def test_prompts_within_the_limits_pass_and_none_is_left_out():
    assert check_prompt_lengths(PROMPTS, build_char_tokenizer(), data(17), 8, 25) == []


def test_a_prompt_over_max_prompt_tokens_is_named():
    with pytest.raises(LengthPolicyError, match=r"train prompt 1 has 17 tokens, over data.max_prompt_tokens=16 "
                                                r"\(1 of 3 prompts are\)"):
        check_prompt_lengths(PROMPTS, build_char_tokenizer(), data(16), 8, None)


def test_prompt_and_new_tokens_over_the_context_are_named():
    with pytest.raises(LengthPolicyError, match=r"train prompt 1 has 17 tokens; with rollout.max_new_tokens=2048 it "
                                                r"needs 2065 positions, over the model's context of 2048"):
        check_prompt_lengths(PROMPTS, build_char_tokenizer(), data(None), 2048, 2048)


def test_filter_leaves_the_overlong_prompts_out_and_checks_the_context_on_the_rest():
    assert check_prompt_lengths(PROMPTS, build_char_tokenizer(), data(14, "filter"), 8, 22) == [1]
    with pytest.raises(LengthPolicyError, match="train prompt 0 has 14 tokens"):  # 14 + 9 > 22: the longest kept
        check_prompt_lengths(PROMPTS, build_char_tokenizer(), data(14, "filter"), 9, 22)
    with pytest.raises(LengthPolicyError, match="all 3 train prompts are over data.max_prompt_tokens=1"):
        check_prompt_lengths(PROMPTS, build_char_tokenizer(), data(1, "filter"), 8, None)


def test_the_run_filters_at_start_with_the_count_logged_and_never_samples_a_left_out_prompt(tmp_path, caplog):
    tok = build_char_tokenizer()
    cfg = Config(data={"arithmetic": {"digits": 3, "num_train": 40, "num_labeled": 10, "num_val": 5},
                       "prompt_template": "{prompt}",
                       "max_prompt_tokens": 17, "overlong_prompts": "filter"})
    save_pretrained_dir(build_tiny_model(cfg.model.tiny, tok, seed=0), tok, tmp_path / "m")
    with caplog.at_level(logging.WARNING):
        excluded = overlong_train_prompts(cfg, str(tmp_path / "m"))
    assert 0 < len(excluded) < 40
    assert f"{len(excluded)} of 40 train prompts are over data.max_prompt_tokens=17 and are left out" in caplog.text
    sampler = PromptSampler(40, 7, seed=3, excluded=excluded)
    drawn = {i for it in range(12) for i in sampler.indices(it)}  # 84 draws: two epochs and more
    assert drawn == set(range(40)) - set(excluded)
    assert overlong_train_prompts(cfg.model_copy(update={"data": cfg.data.model_copy(
        update={"overlong_prompts": "refuse"})}), "never-read") == []  # refuse: the workers check, nothing loaded
