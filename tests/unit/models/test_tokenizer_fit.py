"""A model directory whose tokenizer does not fit its model fails at start with one line: token ids past the
model's embedding rows, or no chat template when ``data.chat_template`` asks for one (``dockflow train`` exits 2
before Ray, SFT and the workers); a worker loading such a model (from s3:// or the registry) says the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from fixtures.tiny_models import tiny_qwen2

from dockflow.cli import main
from dockflow.flow import trainer
from dockflow.models import build_char_tokenizer, load_model_and_tokenizer, save_pretrained_dir
from dockflow.models.tokenizer import with_chat_template
from dockflow.models.tokenizer_fit import TokenizerFitError, check_tokenizer_fits, max_token_id


def model_dir(path: Path, rows_short: int = 0, chat: bool = False) -> Path:
    """A tiny Qwen2 saved with the character tokenizer (with the tiny chat template when ``chat``), its embedding
    ``rows_short`` rows fewer than the tokenizer's ids need."""
    tok = build_char_tokenizer()
    if chat:
        tok = with_chat_template(tok, tools=False)
    return save_pretrained_dir(tiny_qwen2(max_token_id(tok) + 1 - rows_short), tok, path)


def test_a_tokenizer_that_fits_passes_and_one_past_the_embeddings_is_named(tmp_path: Path) -> None:
    check_tokenizer_fits(model_dir(tmp_path / "fits"), chat_template=False)
    short = model_dir(tmp_path / "short", rows_short=1)
    top = max_token_id(build_char_tokenizer())
    with pytest.raises(TokenizerFitError, match=rf"model directory '{short}': its tokenizer produces token ids up to "
                                                rf"{top} but the model has {top} embedding rows"):
        check_tokenizer_fits(short, chat_template=False)
    with pytest.raises(TokenizerFitError, match=f"model directory '{short}'"):  # where a worker loads it
        load_model_and_tokenizer(short)


def test_the_chat_template_is_required_only_when_the_data_asks_for_it(tmp_path: Path) -> None:
    plain = model_dir(tmp_path / "plain")
    check_tokenizer_fits(plain, chat_template=False)
    check_tokenizer_fits(model_dir(tmp_path / "chat", chat=True), chat_template=True)
    with pytest.raises(TokenizerFitError, match="data.chat_template is true but its tokenizer has no chat template"):
        check_tokenizer_fits(plain, chat_template=True)


@pytest.mark.parametrize(("rows_short", "extra", "says"), [
    (3, [], "its tokenizer produces token ids up to"),
    (0, ["data.chat_template=true"], "data.chat_template is true but its tokenizer has no chat template"),
], ids=["vocabulary", "chat template"])
def test_dockflow_train_says_it_in_one_line_and_exits_2(rows_short: int, extra: list[str], says: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = model_dir(tmp_path / "model", rows_short=rows_short)
    capsys.readouterr()  # the save's progress bar
    monkeypatch.setattr(trainer, "connect", lambda *_a, **_kw: pytest.fail("Ray started before the check"))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    args = ["configs/grpo_arith.yaml", f"model.path={path}", "sft.enabled=false", f"run.output_dir={tmp_path / 'runs'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", *extra]
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert err.startswith(f"dockflow train: error: model.path: model directory '{path}': ") and says in err, err
