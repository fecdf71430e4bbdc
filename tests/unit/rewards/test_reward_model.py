"""The reward-model scorer on a tiny one-label classifier built locally: loading, scores, batching, errors."""

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

from dockflow.config import load_config
from dockflow.models import build_char_tokenizer, load_tokenizer, save_pretrained_dir
from dockflow.models.tiny_reward_model import build_tiny_reward_model, main
from dockflow.rewards.sequence_classifier import RewardModel, RewardModelError
from dockflow.storage.objects import stage_model

PROMPTS = ["What is 2 + 3?\nAnswer: ", "What is 7 + 1?\nAnswer: ", "Hi", "What is 12 + 30, please?\nAnswer: "]
RESPONSES = ["5", "eight, I think", "a much longer response that has many more characters", ""]


@pytest.fixture(scope="module")
def storage():
    return load_config("configs/grpo_arith.yaml").checkpoint


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm")


def _small_config(tok, **extra) -> Qwen2Config:
    return Qwen2Config(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, intermediate_size=32, pad_token_id=tok.pad_token_id, **extra)


def test_the_tiny_model_is_a_one_label_qwen2_classifier_with_its_tokenizer(rm_dir):
    rm = RewardModel(rm_dir, load_config("configs/grpo_arith.yaml").checkpoint)
    assert isinstance(rm.model, Qwen2ForSequenceClassification) and rm.model.config.num_labels == 1
    assert not rm.model.training and not any(p.requires_grad for p in rm.model.parameters())
    assert rm.model.config.pad_token_id == rm.tokenizer.pad_token_id and not rm.chat
    assert len(rm.tokenizer) == len(build_char_tokenizer())


def test_scores_are_one_float_per_pair_deterministic_and_differ_between_texts(rm_dir, storage):
    scores = RewardModel(rm_dir, storage).score(PROMPTS, RESPONSES)
    assert len(scores) == len(PROMPTS) and all(isinstance(s, float) for s in scores)
    assert len(set(scores)) == len(scores)
    assert RewardModel(rm_dir, storage).score(PROMPTS, RESPONSES) == scores  # a fresh load, the same scores
    assert RewardModel(rm_dir, storage).score([], []) == []


def test_the_score_is_the_head_on_the_last_token_of_prompt_plus_response(rm_dir, storage):
    rm = RewardModel(rm_dir, storage)
    assert rm.texts(PROMPTS[:1], RESPONSES[:1]) == [PROMPTS[0] + RESPONSES[0]]
    ids = rm.tokenizer(PROMPTS[0] + RESPONSES[0], return_tensors="pt")["input_ids"]
    assert ids[0, 0] == rm.tokenizer.bos_token_id
    with torch.no_grad():
        direct = rm.model(input_ids=ids).logits[0, 0].item()
    assert rm.score(PROMPTS[:1], RESPONSES[:1])[0] == pytest.approx(direct, abs=1e-5)


def test_batch_size_does_not_change_the_scores(rm_dir, storage):
    one_batch = RewardModel(rm_dir, storage, batch_size=64).score(PROMPTS, RESPONSES)
    small = RewardModel(rm_dir, storage, batch_size=3).score(PROMPTS, RESPONSES)
    single = RewardModel(rm_dir, storage, batch_size=1).score(PROMPTS, RESPONSES)
    assert small == pytest.approx(one_batch, abs=1e-5) and single == pytest.approx(one_batch, abs=1e-5)


def test_a_chat_template_formats_the_pair_as_user_and_assistant_turns(rm_dir, storage, tmp_path):
    chat_dir = tmp_path / "chat-rm"
    rm = RewardModel(rm_dir, storage)
    rm.tokenizer.chat_template = (
        "{% for m in messages %}<bos>{{ m['role'] }}: {{ m['content'] }}<eos>{% endfor %}"
    )
    save_pretrained_dir(rm.model, rm.tokenizer, chat_dir)
    chat = RewardModel(chat_dir, storage)
    assert chat.chat
    assert chat.texts(["Q?"], ["A."]) == ["<bos>user: Q?<eos><bos>assistant: A.<eos>"]
    ids = chat.tokenizer("<bos>user: Q?<eos><bos>assistant: A.<eos>", add_special_tokens=False)["input_ids"]
    assert ids[0] == chat.tokenizer.bos_token_id and ids[1] != chat.tokenizer.bos_token_id  # no second BOS
    assert len(chat.score(PROMPTS, RESPONSES)) == len(PROMPTS)
    with_system = RewardModel(chat_dir, storage, system_prompt="Be brief.")
    assert with_system.texts(["Q?"], ["A."]) == ["<bos>system: Be brief.<eos><bos>user: Q?<eos><bos>assistant: A.<eos>"]
    conversation = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": "Q?"}]  # a conversational row's prompt: its messages as they are
    assert with_system.texts([conversation], ["A."]) == [
        "<bos>system: Be brief.<eos><bos>user: Hi.<eos><bos>assistant: Hello.<eos><bos>user: Q?<eos><bos>assistant: A.<eos>"]
    own_system = [{"role": "system", "content": "Be long."}, {"role": "user", "content": "Q?"}]
    assert with_system.texts([own_system], ["A."]) == ["<bos>system: Be long.<eos><bos>user: Q?<eos><bos>assistant: A.<eos>"]


def test_a_model_on_s3_is_fetched_and_scores_like_its_local_copy(rm_dir, storage, s3_checkpoint_dir, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv("DOCKFLOW_CACHE_DIR", str(tmp_path / "cache"))
    uri = stage_model(rm_dir, f"{s3_checkpoint_dir}/rm", storage)
    remote = RewardModel(uri, storage)
    assert remote.score(PROMPTS, RESPONSES) == RewardModel(rm_dir, storage).score(PROMPTS, RESPONSES)
    assert any((tmp_path / "cache" / "models").iterdir())
    with pytest.raises(RewardModelError, match="could not be loaded") as err:
        RewardModel(f"{s3_checkpoint_dir}/nothing-here", storage)
    assert f"{s3_checkpoint_dir}/nothing-here" in str(err.value) and "\n" not in str(err.value)


def test_a_classifier_with_two_labels_is_refused_in_one_line(tmp_path, storage):
    tok = build_char_tokenizer()
    path = save_pretrained_dir(Qwen2ForSequenceClassification(_small_config(tok, num_labels=2)), tok, tmp_path / "two")
    with pytest.raises(RewardModelError, match="num_labels=2") as err:
        RewardModel(path, storage)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_causal_lm_is_refused_in_one_line(tmp_path, storage):
    tok = build_char_tokenizer()
    path = save_pretrained_dir(Qwen2ForCausalLM(_small_config(tok)), tok, tmp_path / "lm")
    with pytest.raises(RewardModelError, match="Qwen2ForCausalLM, not a sequence classifier") as err:
        RewardModel(path, storage)
    assert "\n" not in str(err.value)


def test_a_missing_or_incomplete_directory_is_refused_in_one_line(tmp_path, storage, rm_dir):
    missing = tmp_path / "nope"
    with pytest.raises(RewardModelError, match="does not exist") as err:
        RewardModel(missing, storage)
    assert str(missing) in str(err.value) and "reward.models" in str(err.value) and "\n" not in str(err.value)
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((rm_dir / "config.json").read_text())
    with pytest.raises(RewardModelError, match="is missing weights") as err:
        RewardModel(partial, storage)
    assert "tokenizer" in str(err.value) and "\n" not in str(err.value)


def test_a_corrupt_config_is_refused_in_one_line(tmp_path, storage, rm_dir):
    broken = tmp_path / "broken"
    save_pretrained_dir(*_load_pair(rm_dir), broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(RewardModelError, match="could not be loaded") as err:
        RewardModel(broken, storage)
    assert str(broken) in str(err.value) and "\n" not in str(err.value)


def test_the_builder_takes_the_tokenizer_of_a_model_directory_and_runs_from_a_shell(tmp_path, rm_dir, capsys):
    tok = build_char_tokenizer(["What is 2 + 3?\nAnswer: 5"] * 4, num_merges=8)
    tok.save_pretrained(tmp_path / "policy")
    path = build_tiny_reward_model(tmp_path / "rm", tmp_path / "policy", seed=1)
    assert len(load_tokenizer(path)) == len(tok) != len(build_char_tokenizer())
    main([str(tmp_path / "cli-rm")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli-rm")
    assert (tmp_path / "cli-rm" / "model.safetensors").read_bytes() == (rm_dir / "model.safetensors").read_bytes()


def _load_pair(path: Path):
    rm = RewardModel(path, load_config("configs/grpo_arith.yaml").checkpoint)
    return rm.model, rm.tokenizer
