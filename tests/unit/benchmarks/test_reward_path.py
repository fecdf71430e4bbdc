"""The reward-path benchmark's inputs: one demo iteration of finished rollouts, decoded the same way before and now."""

from __future__ import annotations

from benchmarks.reward_path import driver_parts, path_config, rollouts
from dockflow.data import load_task
from dockflow.engines import decode_responses
from dockflow.models import build_char_tokenizer
from dockflow.rewards.builtins import math_verify


def test_one_demo_iteration_of_rollouts_half_right(tmp_path) -> None:
    cfg = path_config("in_worker", str(tmp_path))
    assert [f.in_worker for f in cfg.reward.functions] == [True]
    assert [f.in_worker for f in path_config("child", str(tmp_path)).reward.functions] == [False]
    tok = build_char_tokenizer()
    n = cfg.rollout.group_size
    answers = [ex.answer for ex in load_task(cfg.data, cfg.run.seed).train[: cfg.rollout.prompts_per_iter]]
    data, meta = rollouts(cfg, tok, answers, seed=0)
    assert len(data) == cfg.global_batch == 256 and meta["prompt_id"].tolist()[:n + 1] == [0] * n + [1]
    texts = decode_responses(tok, data["responses"], data["response_mask"])
    right = math_verify([""] * len(texts), texts, answer=[answers[k // n] for k in range(len(texts))])
    assert 0.3 < sum(right) / len(right) < 0.7
    assert set(driver_parts(tok, (data, meta), answers, n)) == {"decode_before", "decode_now", "verify"}
