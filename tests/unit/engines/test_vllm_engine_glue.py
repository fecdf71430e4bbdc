"""``VLLMGenerationEngine`` and ``ColocatedTraining`` against a stand-in for the ``vllm`` module.

The stand-in implements only the surface the engine calls, with the shapes vLLM 0.33 gives them
(``LLM(**kwargs)``, ``LLM.generate(prompts, sampling_params, use_tqdm=...)`` returning ``RequestOutput``-like
objects whose ``outputs`` carry ``index``, ``token_ids``, ``logprobs`` and ``finish_reason``,
``collective_rpc(fn, args=...)``, ``sleep(level)``, ``wake_up(tags)``, ``reset_prefix_cache()``). It samples
random tokens, not a model: these tests check DockFlow's side (layout, request plan, weight streaming, the
sleep/wake order), not vLLM. The real library is exercised by the gpu/npu tests (tests/integration/test_vllm_device.py).
"""

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from dockflow.config import Config
from dockflow.engines import SamplingParams, TorchTrainingEngine
from dockflow.engines.hf_generation import left_pad_prompts
from dockflow.engines.vllm_convert import checkpoint_weights
from dockflow.models import build_char_tokenizer, build_tiny_model

PROMPTS = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: "]


class FakeLLM:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.staged = sorted(p.name for p in __import__("pathlib").Path(kwargs["model"]).iterdir())
        self.events: list = []
        self.loaded: dict[str, torch.Tensor] = {}
        self.requests: list = []
        model = SimpleNamespace(load_weights=self._load)
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(model=model))

    def _load(self, weights):
        for name, tensor in weights:
            self.loaded[name] = tensor.clone()
        return set(self.loaded)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.events.append("load")
        return [method(self.worker, *args, **(kwargs or {}))]

    def generate(self, prompts, sampling_params, *, use_tqdm=True):
        self.events.append("generate")
        outputs = []
        for prompt, sp in zip(prompts, sampling_params, strict=True):
            self.requests.append((list(prompt["prompt_token_ids"]), sp))
            samples = []
            for k in range(sp.n):
                g = torch.Generator().manual_seed(sp.seed + k)
                tokens = [3 + k]  # the first token tells the sample's index
                while len(tokens) < sp.max_tokens and tokens[-1] not in sp.stop_token_ids:
                    tokens.append(sp.stop_token_ids[0] if torch.rand(1, generator=g) < 0.3 else
                                  int(torch.randint(3, 20, (1,), generator=g)))
                logprobs = [{t: SimpleNamespace(logprob=-0.1 * (i + 1), rank=1)} for i, t in enumerate(tokens)]
                reason = "stop" if tokens[-1] in sp.stop_token_ids else "length"
                samples.append(SimpleNamespace(index=k, token_ids=tokens, logprobs=logprobs, finish_reason=reason))
            outputs.append(SimpleNamespace(outputs=samples[::-1]))  # vLLM's order within a request is not relied on
        return outputs

    def sleep(self, level=1):
        self.events.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.events.append("wake:" + ",".join(tags))

    def reset_prefix_cache(self):
        self.events.append("reset")


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM
    vllm.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # a TypedDict in vLLM
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)


def _setup(tp: int = 1, colocated: bool = True):
    from dockflow.engines.vllm_generation import VLLMGenerationEngine

    cfg = Config(engine={"backend": "vllm", "device": "cuda", "vllm": {"tensor_parallel_size": tp,
                                                                        "weight_bucket_mb": 0.01}})
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model.tiny, tok, seed=0)
    return cfg, tok, model, VLLMGenerationEngine(model, tok, cfg, colocated=colocated)


def test_construction_stages_files_and_loads_the_policy(fake_vllm):
    import os

    _, _, model, engine = _setup()
    llm = engine.llm
    assert "config.json" in llm.staged and "tokenizer.json" in llm.staged and not any(
        n.endswith(".safetensors") for n in llm.staged)
    kw = llm.kwargs
    assert (kw["load_format"], kw["logprobs_mode"], kw["skip_tokenizer_init"]) == ("dummy", "processed_logprobs", True)
    assert kw["tensor_parallel_size"] == 1 and kw["enable_sleep_mode"] and "distributed_executor_backend" not in kw
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    expected = dict(checkpoint_weights(model.named_parameters(), tie_word_embeddings=True))
    assert sorted(llm.loaded) == sorted(expected)
    assert all(torch.equal(llm.loaded[n], t) for n, t in expected.items())
    assert llm.events.count("load") > 1  # a 10 KiB bucket: the weights were streamed, not sent at once
    assert llm.events[-1] == "reset"


def test_generate_lays_out_groups_like_the_hf_engine(fake_vllm):
    _, tok, _, engine = _setup()
    out = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=3, temperature=0.8), seed=4, prompt_width=30)
    assert out["input_ids"].shape == (6, 36) and out["rollout_log_prob"].shape == (6, 6)
    prompt_ids, prompt_mask = left_pad_prompts(tok, PROMPTS, 30)
    assert torch.equal(out["input_ids"][:, :30], prompt_ids.repeat_interleave(3, 0))
    assert out["responses"][:, 0].tolist() == [3, 4, 5, 3, 4, 5]  # each prompt's samples, in index order
    mask = out["response_mask"]
    assert torch.equal(out["attention_mask"][:, 30:], mask)
    assert torch.equal(out["rollout_log_prob"], out["rollout_log_prob"] * mask)
    eos = tok.eos_token_id
    for row, m in zip(out["responses"], mask, strict=True):
        n = int(m.sum())
        assert n == 6 or row[n - 1] == eos
        assert (row[n:] == tok.pad_token_id).all()
    sent = engine.llm.requests
    assert [p for p, _ in sent] == [[int(t) for t in r[m.bool()]] for r, m in zip(prompt_ids, prompt_mask, strict=True)]
    assert all(sp.n == 3 and sp.temperature == 0.8 and sp.stop_token_ids == [eos] for _, sp in sent)


def test_greedy_groups_are_single_sample_requests(fake_vllm):
    _, _, _, engine = _setup()
    out = engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, n=2, greedy=True), seed=0)
    assert out.batch_size[0] == 4
    assert [(sp.n, sp.temperature) for _, sp in engine.llm.requests] == [(1, 0.0)] * 4


def test_sample_continues_unpadded_rows(fake_vllm):
    _, tok, _, engine = _setup()
    pad = tok.pad_token_id
    ids = torch.tensor([[pad, pad, 7, 8], [5, 6, 7, 8]])
    mask = (ids != pad).long()
    tokens, logp = engine.sample(ids, mask, 5, SamplingParams(n=4), seed=1)
    assert tokens.shape == logp.shape == (2, 5)
    assert [p for p, _ in engine.llm.requests] == [[7, 8], [5, 6, 7, 8]]
    assert all(sp.n == 1 and sp.max_tokens == 5 for _, sp in engine.llm.requests)


def test_colocated_sleep_sync_wake_order(fake_vllm):
    from dockflow.engines.vllm_generation import ColocatedTraining

    cfg, tok, model, engine = _setup()
    train = ColocatedTraining(TorchTrainingEngine(model, lr=1e-3), engine)
    assert train.model is model  # the wrapped engine's attributes
    llm = engine.llm
    data = engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, n=2), seed=0)
    llm.events.clear()
    train.infer(data)
    train.infer(data)
    assert llm.events == ["sleep2"]  # once, before the first training call
    with pytest.raises(RuntimeError, match="level 2"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=4), seed=0)
    llm.events.clear()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    engine.load_weights(train.generation_weights())
    assert llm.events[0] == "wake:weights" and llm.events[-2:] == ["wake:kv_cache", "reset"]
    assert set(llm.events[1:-2]) == {"load"}
    assert torch.equal(llm.loaded["model.norm.weight"], model.model.norm.weight)
    llm.events.clear()
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=4), seed=0)
    assert llm.events == ["generate"]
    # a restored checkpoint: vLLM reloads before it samples again
    train.load_state_dict(train.state_dict())
    llm.events.clear()
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=4), seed=0)
    assert llm.events[-1] == "generate" and "load" in llm.events


def test_disaggregated_never_sleeps_and_tp_uses_worker_processes(fake_vllm):
    _, _, _, engine = _setup(tp=2, colocated=False)
    assert engine.llm.kwargs["distributed_executor_backend"] == "mp"
    assert engine.llm.kwargs["tensor_parallel_size"] == 2 and not engine.llm.kwargs["enable_sleep_mode"]
    engine.sleep()
    assert "sleep2" not in engine.llm.events
