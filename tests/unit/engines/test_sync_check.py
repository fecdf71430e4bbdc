"""The weight-sync check and the rollout-vs-trainer drift metric (``dockflow/engines/sync_check.py``), and the
tied-module finder the vLLM worker extension rebuilds after a reload (``dockflow/engines/vllm_worker.py``)."""

import math

import pytest
import torch

from dockflow.config import Config
from dockflow.config.engine import sync_tolerance
from dockflow.engines import HFGenerationEngine
from dockflow.engines.sync_check import (
    LogProbDrift,
    SyncChecker,
    WeightSyncError,
    probe_tokens,
    reference_log_probs,
)
from dockflow.engines.vllm_worker import shared_parameter_modules
from dockflow.models import build_char_tokenizer, build_tiny_model


@pytest.fixture
def model_and_tok():
    tok = build_char_tokenizer()
    return build_tiny_model(Config().model.tiny, tok, seed=0).eval(), tok


def test_probe_tokens_are_fixed_by_the_seed():
    a, b = probe_tokens(50, 4, 16, seed=3), probe_tokens(50, 4, 16, seed=3)
    assert torch.equal(a, b) and a.shape == (4, 16) and int(a.max()) < 50
    assert not torch.equal(a, probe_tokens(50, 4, 16, seed=4))


def test_reference_log_probs_are_next_token_log_softmax(model_and_tok):
    model, tok = model_and_tok
    tokens = probe_tokens(len(tok), 2, 6, seed=0)
    ref = reference_log_probs(model, tokens)
    logits = model(input_ids=tokens).logits[:, :-1]
    expected = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    assert ref.shape == (2, 5) and torch.allclose(ref, expected, atol=1e-6)


def test_the_hf_engine_passes_and_a_changed_copy_fails_naming_the_sync(model_and_tok):
    model, tok = model_and_tok
    checker = SyncChecker(every=2, sequences=3, length=8, tolerance=1e-3, seed=0)
    assert checker.next_probe(model, len(tok)) is None  # sync 1 is not checked with every=2
    probe = checker.next_probe(model, len(tok))
    assert probe is not None and probe.sync == 2
    engine = HFGenerationEngine(model, tok, device="cpu", batch_size=8)
    assert engine.check_sync(probe) == 0.0  # the same tensors
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.add_(0.5)  # the generation copy drifted from the trainer's
    with pytest.raises(WeightSyncError, match=r"weight sync 2 did not take: HFGenerationEngine's log-probs of 3"):
        engine.check_sync(probe)


def test_only_the_engine_on_the_policys_own_module_skips_the_check(model_and_tok):
    """Colocated HF generation samples the trainer's module: the actor skips the check (it would compare the module
    with itself); an engine on another module (a generator's copy) is checked."""
    model, tok = model_and_tok
    copy = build_tiny_model(Config().model.tiny, tok, seed=1)
    assert HFGenerationEngine(model, tok).samples_with(model)
    assert not HFGenerationEngine(copy, tok).samples_with(model)


def test_a_nan_or_a_wrong_shape_fails(model_and_tok):
    model, tok = model_and_tok
    probe = SyncChecker(1, 2, 4, 1e-3, 0).next_probe(model, len(tok))
    with pytest.raises(WeightSyncError, match="did not take"):
        probe.verify(torch.full_like(probe.reference, math.nan), "x")
    with pytest.raises(WeightSyncError, match=r"scored the probe as \(2, 2\)"):
        probe.verify(probe.reference[:, :2], "x")


def test_every_zero_never_checks(model_and_tok):
    model, tok = model_and_tok
    checker = SyncChecker(every=0, sequences=2, length=4, tolerance=1e-3, seed=0)
    assert [checker.next_probe(model, len(tok)) for _ in range(3)] == [None, None, None]


def test_tolerance_defaults_by_dtype():
    cfg = Config()
    assert sync_tolerance(cfg.engine, "float32") == 1e-3 and sync_tolerance(cfg.engine, "bfloat16") == 5e-2
    assert sync_tolerance(Config(engine={"sync_check": {"tolerance": 0.2}}).engine, "float32") == 0.2


def test_drift_metrics_over_masked_tokens():
    drift = LogProbDrift()
    assert drift.metrics() == {}
    rollout = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, 0.0, 0.0]])
    trainer = torch.tensor([[-1.1, -2.0, 0.0], [-0.2, 0.0, 0.0]])
    drift.add(rollout, trainer, torch.tensor([[1, 1, 0], [1, 0, 0]]))  # the 9.0 is padding: not counted
    drift.add(rollout, trainer, torch.zeros(2, 3, dtype=torch.long))
    m = drift.metrics()
    assert m["rollout/logprob_abs_diff_mean"] == pytest.approx(0.4 / 3)
    assert m["rollout/logprob_abs_diff_max"] == pytest.approx(0.3)
    assert m["rollout/token_mult_prob_error"] == pytest.approx((math.exp(0.1) + 1 + math.exp(0.3)) / 3)


def test_shared_parameter_modules_find_a_tied_head(model_and_tok):
    model, _ = model_and_tok
    assert model.config.tie_word_embeddings
    assert shared_parameter_modules(model) == [model.model.embed_tokens, model.lm_head]
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert shared_parameter_modules(model) == []
