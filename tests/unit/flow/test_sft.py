"""SFT warm start on a very small budget: it learns, early-stops, caches, and reuses the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dockflow.config import Config, load_config
from dockflow.data import Example, PromptFormat, apply_template
from dockflow.eval.greedy import greedy_accuracy, greedy_responses
from dockflow.flow.sft import (
    SFTInputs,
    WeightAverage,
    encode_sft_batch,
    sft_cache_key,
    sft_warm_start,
    train_sft,
)
from dockflow.models import build_tiny_model, load_model_and_tokenizer

SMALL = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64",
    "data.arithmetic.digits=1",
    "data.arithmetic.num_train=40",
    "data.arithmetic.num_labeled=8",
    "data.arithmetic.num_val=8",
    "data.arithmetic.num_test=8",
    "rollout.max_new_tokens=4",
]


def _of(cfg: Config) -> SFTInputs:
    return SFTInputs(cfg.model, cfg.data, cfg.sft, cfg.checkpoint, cfg.run.seed, cfg.rollout.max_new_tokens,
                     cfg.eval.batch_size)


def _inputs(tmp_path: Path, *extra: str) -> SFTInputs:
    return _of(load_config(None, [*SMALL, f"sft.cache_dir={tmp_path / 'cache'}", *extra]))


def test_labels_cover_only_answer_and_eos(char_tok) -> None:
    batch = encode_sft_batch(char_tok, [Example("What is 1 + 2?", "3"), Example("Hi?", "-10")], PromptFormat("Q: {prompt}"))
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == mask.shape
    first = labels[0][labels[0] != -100].tolist()
    assert char_tok.decode(first[:-1]) == "3" and first[-1] == char_tok.eos_token_id
    second = labels[1][labels[1] != -100].tolist()
    assert char_tok.decode(second[:-1]) == "-10"
    assert mask[1].tolist()[-1] == 0 and ids[1].tolist()[-1] == char_tok.pad_token_id  # right-padded


def test_training_lowers_loss_and_reaches_full_train_accuracy(tmp_path: Path, micro_cfg, char_tok) -> None:
    budget = ("sft.lr=3e-3", "sft.warmup_steps=0", "sft.batch_size=4", "sft.max_epochs=200", "sft.eval_every_epochs=10", "sft.patience=10")
    inputs = _inputs(tmp_path, *budget)
    examples = [Example(f"What is {a} + {b}?", str(a + b)) for a, b in [(1, 2), (3, 4), (5, 0), (2, 2)]]
    model = build_tiny_model(micro_cfg, char_tok, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    acc, history = train_sft(inputs, model, char_tok, examples, examples)
    assert history[-1]["epoch"] < 200  # a perfect validation ends training early
    losses = [h["loss"] for h in history[1:]]
    assert losses[-1] < 0.5 * losses[0]
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert acc == 1.0 == greedy_accuracy(model, char_tok, examples, 2, 4, PromptFormat.of(inputs.data))
    wrong = [Example(e.prompt, str(int(e.answer) + 1)) for e in examples]
    assert greedy_accuracy(model, char_tok, wrong, 3, 4, PromptFormat.of(inputs.data)) == 0.0
    prompts = [apply_template(inputs.data.prompt_template, e.prompt) for e in examples]
    batched = greedy_responses(model, char_tok, prompts, batch_size=4, max_new_tokens=4)
    assert batched == [greedy_responses(model, char_tok, [p], 1, 4)[0] for p in prompts]
    assert batched == [e.answer for e in examples]


def test_the_weight_average_follows_every_step_with_its_decay_warmed_up(micro_cfg, char_tok) -> None:
    model = build_tiny_model(micro_cfg, char_tok, seed=0)
    assert WeightAverage(model, 0.0).model is model  # decay 0: the weights themselves, no copy
    average = WeightAverage(model, 0.9)
    weight, averaged = next(model.parameters()), next(average.model.parameters())
    expected = weight.detach().clone()
    for step in range(1, 101):
        with torch.no_grad():
            weight.add_(1.0)  # an optimizer step
        average.update()
        decay = min(0.9, (1 + step) / (10 + step))  # 0.18 at the first step, 0.9 from the 80th
        expected = decay * expected + (1 - decay) * weight.detach()
    torch.testing.assert_close(averaged, expected, rtol=1e-6, atol=1e-5)
    assert not torch.equal(averaged, weight)


def test_early_stop_keeps_best_weights(tmp_path: Path, micro_cfg, char_tok) -> None:
    inputs = _inputs(tmp_path, "sft.lr=0.0", "sft.max_epochs=50", "sft.eval_every_epochs=1", "sft.patience=2")
    examples = [Example("What is 1 + 2?", "3")]
    model = build_tiny_model(micro_cfg, char_tok, seed=0)
    _, history = train_sft(inputs, model, char_tok, examples, examples)
    assert [h["epoch"] for h in history] == [0, 1, 2]  # lr 0 never improves: stop after patience=2


def test_warm_start_caches_and_second_call_hits(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, "sft.max_epochs=2", "sft.eval_every_epochs=1", "sft.batch_size=4")
    first = sft_warm_start(inputs, tmp_path / "run1")
    assert not first.cached and first.model_dir.parent == tmp_path / "cache"
    assert [h["epoch"] for h in first.history] == [0, 1, 2]
    assert json.loads((tmp_path / "run1" / "sft.json").read_text())["cached"] is False
    model, tok = load_model_and_tokenizer(first.model_dir)
    assert model.config.hidden_size == 32
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.model_dir.name]  # no temp dirs

    mtime = (first.model_dir / "model.safetensors").stat().st_mtime_ns
    second = sft_warm_start(inputs, tmp_path / "run2")
    assert second.cached and second.model_dir == first.model_dir
    assert (second.val_accuracy, second.history) == (first.val_accuracy, first.history)
    assert (first.model_dir / "model.safetensors").stat().st_mtime_ns == mtime


def test_cache_key_covers_inputs(tmp_path: Path) -> None:
    base = sft_cache_key(_inputs(tmp_path))
    assert sft_cache_key(_inputs(tmp_path)) == base
    assert sft_cache_key(_of(load_config(None, [*SMALL, "sft.cache_dir=/elsewhere"]))) == base
    assert sft_cache_key(_inputs(tmp_path, "model.lora={rank: 4}")) == base  # SFT trains before the adapters
    changes = (
        "run.seed=1",
        "sft.lr=0.5",
        "data.prompt_template='Q: {prompt}'",
        "model.tiny.num_layers=3",
        "data.arithmetic.num_labeled=4",
        "rollout.max_new_tokens=5",
    )
    for change in changes:
        assert sft_cache_key(_inputs(tmp_path, change)) != base, change


@pytest.mark.parametrize("content", ['{"prompt": "a?", "answer": 1}\n', '{"prompt": "a?", "answer": 2}\n'])
def test_cache_key_covers_file_contents(tmp_path: Path, content: str) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "a?", "answer": 1}\n')
    files = ["data.source=file", f"data.train_path={train}", f"data.test_path={train}"]
    before = sft_cache_key(_inputs(tmp_path, *files))
    train.write_text(content)
    assert (sft_cache_key(_inputs(tmp_path, *files)) == before) == ("1" in content)


def test_cache_key_and_initial_model_from_s3(
    s3_checkpoint_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, micro_cfg, char_tok
) -> None:
    import io

    from dockflow.config import CheckpointConfig
    from dockflow.flow.sft import _initial_model
    from dockflow.models import save_pretrained_dir
    from dockflow.storage import stage_model
    from dockflow.storage.s3_bucket import S3Bucket
    from dockflow.storage.s3_client import S3Options

    monkeypatch.setenv("DOCKFLOW_CACHE_DIR", str(tmp_path / "fetch"))
    bucket = S3Bucket("dockflow-test", S3Options.from_config(CheckpointConfig()))

    def put(url: str, data: bytes) -> str:
        bucket.client.put_object("dockflow-test", url.removeprefix("s3://dockflow-test/"), io.BytesIO(data), len(data))
        return url

    src = save_pretrained_dir(build_tiny_model(micro_cfg, char_tok, seed=0), char_tok, tmp_path / "m")
    model = stage_model(src, f"{s3_checkpoint_dir}/model", CheckpointConfig())
    train = put(f"{s3_checkpoint_dir}/train.jsonl", b'{"prompt": "a?", "answer": 1}\n')
    files = ["data.source=file", f"data.train_path={train}", f"data.test_path={train}", f"model.path={model}"]
    key = sft_cache_key(_inputs(tmp_path, *files))
    assert sft_cache_key(_inputs(tmp_path, *files)) == key and not (tmp_path / "fetch").exists()  # nothing fetched
    put(train, b'{"prompt": "a?", "answer": 2}\n')
    assert sft_cache_key(_inputs(tmp_path, *files)) != key
    key = sft_cache_key(_inputs(tmp_path, *files))
    (src / "generation_config.json").write_text("{}")
    stage_model(src, model, CheckpointConfig())  # another model at the same URI
    assert sft_cache_key(_inputs(tmp_path, *files)) != key
    lm, _ = _initial_model(_inputs(tmp_path, *files))  # fetched into the node's cache, then loaded
    assert lm.config.hidden_size == micro_cfg.hidden_size and any((tmp_path / "fetch" / "models").iterdir())


def test_sft_command_prints_history_and_test_accuracy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dockflow.cli import main

    budget = ["sft.max_epochs=1", "sft.batch_size=4", "eval.num_prompts=3", f"run.output_dir={tmp_path}"]
    assert main(["sft", *SMALL, f"sft.cache_dir={tmp_path / 'cache'}", *budget]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[:2] for line in lines[:-1]] == [["epoch", "0"], ["epoch", "1"]]
    assert "cached=False" in lines[-1] and "test_accuracy=" in lines[-1] and lines[-1].endswith("(n=3)")
    assert (tmp_path / "dockflow" / "sft.json").is_file()  # run.name's directory


def test_warm_start_below_its_floor_stops_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``sft.min_val_accuracy``: a warm start that has not learned stops ``dockflow sft`` (after its history) and the
    run's start with one line; at or above the floor it passes."""
    from dockflow.cli import main
    from dockflow.flow.sft import SFTNotLearnedError, SFTResult, check_learned

    budget = ["sft.max_epochs=1", "sft.lr=0.0", "sft.batch_size=4", "eval.num_prompts=3", f"run.output_dir={tmp_path}"]
    args = ["sft", *SMALL, f"sft.cache_dir={tmp_path / 'cache'}", *budget]
    assert main([*args, "sft.min_val_accuracy=1.0"]) == 2  # an untrained model scores below 100%
    out, err = capsys.readouterr()
    assert out.splitlines()[0].split()[:2] == ["epoch", "0"] and "cached=False" in out  # the history came first
    errors = [line for line in err.splitlines() if "error:" in line]  # stderr also holds the progress bars
    assert len(errors) == 1 and errors[0].startswith("dockflow sft: error: ") and "sft.min_val_accuracy=100.0%" in errors[0]
    check_learned(SFTResult(tmp_path, 0.5, []), 0.5)
    check_learned(SFTResult(tmp_path, 0.0, []), None)
    with pytest.raises(SFTNotLearnedError, match="validation accuracy, below sft.min_val_accuracy=50.0%"):
        check_learned(SFTResult(tmp_path, 0.49, []), 0.5)
