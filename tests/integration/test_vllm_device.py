"""The vLLM engine on a real device: marked ``gpu`` (CUDA, vLLM) or ``npu`` (Ascend, vLLM-Ascend) and skipped by
default (``pytest -m gpu tests/integration/test_vllm_device.py``; docs/engines.md). Never run where they were
written (no GPU or NPU there). Each test says what it shows.
"""

import pytest
import torch

from dockflow.config import Config
from dockflow.engines import EngineInputs, SamplingParams, create_engines
from dockflow.engines.devices import accelerator_module
from dockflow.flow.trainer import train
from dockflow.models import build_char_tokenizer, build_tiny_model
from dockflow.rollout.partial import continue_rollouts, unfinished

DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu), pytest.param("npu", marks=pytest.mark.npu)]
PROMPTS = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: ", "What is 1 + 1?\nAnswer: "]
SMALL_VLLM = {"gpu_memory_utilization": 0.3, "enforce_eager": True, "weight_bucket_mb": 1}


def _engines(device: str, temperature: float = 0.7):
    cfg = Config(engine={"backend": "vllm", "device": device, "vllm": SMALL_VLLM},
                 rollout={"temperature": temperature})
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model.tiny, tok, seed=0)
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    train_engine, gen = create_engines(inputs, model, tok)
    return cfg, tok, train_engine, gen


@pytest.mark.parametrize("device", DEVICES)
def test_rollout_log_probs_mean_what_the_training_engine_computes(device):
    """vLLM's processed log-probs of its sampled tokens equal the training engine's recomputed ones (logits /
    temperature), in the rollout layout, so old_log_prob=rollout and truncated IS work as on CPU."""
    _, tok, train_engine, gen = _engines(device, temperature=0.7)
    out = gen.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.7, n=4), seed=1, prompt_width=30)
    assert out["responses"].shape == (12, 8)
    recomputed = train_engine.infer(out)
    mask = out["response_mask"].bool()
    assert torch.allclose(out["rollout_log_prob"][mask], recomputed[mask], atol=2e-3)
    assert gen.decode(out["responses"], out["response_mask"])[0] == tok.decode(
        out["responses"][0][mask[0]].tolist(), skip_special_tokens=True)


@pytest.mark.parametrize("device", DEVICES)
def test_weight_sync_changes_what_vllm_generates(device):
    """Loading changed weights changes vLLM's greedy responses; loading the originals back restores them."""
    _, _, train_engine, gen = _engines(device)
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    before = gen.generate(PROMPTS, greedy, seed=0)
    originals = {n: t.clone() for n, t in train_engine.named_weights()}
    with torch.no_grad():
        for p in train_engine.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    gen.load_weights(train_engine.generation_weights())
    changed = gen.generate(PROMPTS, greedy, seed=0)
    assert not torch.equal(changed["rollout_log_prob"], before["rollout_log_prob"])
    with torch.no_grad():
        for n, p in train_engine.model.named_parameters():
            p.copy_(originals[n])
    gen.load_weights(train_engine.generation_weights())
    assert torch.equal(gen.generate(PROMPTS, greedy, seed=0)["responses"], before["responses"])


@pytest.mark.parametrize("device", DEVICES)
def test_sleep_frees_device_memory_and_wake_restores_generation(device):
    """A training call puts vLLM to sleep (level 2: KV cache and weights released: free memory rises by at least the
    KV cache); the weight sync wakes it and generation works again."""
    _, _, train_engine, gen = _engines(device)
    module = accelerator_module(device)
    out = gen.generate(PROMPTS, SamplingParams(max_new_tokens=4), seed=0)
    free_awake = module.mem_get_info()[0]
    train_engine.infer(out)
    free_asleep = module.mem_get_info()[0]
    assert free_asleep - free_awake > 2**28  # at 0.3 utilisation the KV cache alone is several GiB
    gen.load_weights(train_engine.generation_weights())
    assert module.mem_get_info()[0] < free_asleep
    assert gen.generate(PROMPTS, SamplingParams(max_new_tokens=4), seed=0)["responses"].shape == (3, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_partial_rollouts_continue_on_vllm(device):
    """engine.sample continues interrupted rows (partial rollout): finished rows stay, the others grow."""
    _, tok, _, gen = _engines(device)
    params = SamplingParams(max_new_tokens=8, n=2)
    data = gen.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2), seed=0, prompt_width=30)
    short = data.clone()
    short["response_mask"][:, 3:] = 0  # as if a token budget of 3 had cut every row
    short["attention_mask"][:, 33:] = 0
    short["response_length"] = short["response_mask"].sum(-1)
    todo = unfinished(short, tok.eos_token_id)
    out = continue_rollouts(gen, short, params, seed=1, budget=None, pad=tok.pad_token_id, eos=tok.eos_token_id)
    assert (out["response_length"][todo] > short["response_length"][todo]).all()
    assert torch.equal(out["responses"][~todo], short["responses"][~todo])


@pytest.mark.parametrize("device", DEVICES)
def test_two_grpo_iterations_with_vllm(device, tiny_config):
    """The whole loop on the device: generation by vLLM, training by torch, the weight sync between them."""
    cfg = tiny_config("vllm", 2, engine__backend="vllm", engine__device=device, sft__enabled=False, eval__every=0,
                      checkpoint__every=0, engine__vllm__gpu_memory_utilization=0.3, engine__vllm__enforce_eager=True)
    summary = train(cfg)
    assert summary["iterations"] == 2 and summary["throughput_tps"] > 0
