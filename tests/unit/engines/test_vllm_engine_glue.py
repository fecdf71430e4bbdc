"""What ``VLLMGenerationEngine`` does only on a GPU or NPU, against a stand-in for the ``vllm`` module.

The real vLLM (its CPU build) runs in ``tests/integration/test_vllm_cpu.py``: layout, greedy requests, weight
syncs, partial rollouts. vLLM's CPU backend has no sleep mode and DockFlow refuses tensor parallelism on cpu, so
the sleep / wake order of the colocated actor, tensor-parallel worker processes and the Ascend settings are
checked here, with a stand-in at the ``vllm.LLM`` boundary: it records calls, it samples nothing that matters.
The device tests (``tests/integration/test_vllm_device.py``, marked gpu/npu) run the real thing there.
"""

import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from dockflow.config import Config, LoraConfig
from dockflow.engines import EngineInputs, SamplingParams, TorchTrainingEngine
from dockflow.engines.lora import with_lora
from dockflow.engines.vllm_convert import checkpoint_weights
from dockflow.models import build_char_tokenizer, build_tiny_model

PROMPTS = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: "]


class StandInLLM:
    """``vllm.LLM``'s surface as the engine calls it, recording each call in ``events``."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        os.environ["LD_PRELOAD"] = "libgomp.so.1"  # what vLLM's CPU platform sets for its worker processes
        os.environ["VLLM_DIST_IDENT"] = "ident"  # one of vLLM's own runtime settings
        self.events: list[str] = []
        self.loaded: dict[str, torch.Tensor] = {}
        config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=128))
        self.llm_engine = SimpleNamespace(vllm_config=config, add_request=self._add_request)

    def _add_request(self, request_id, prompt, params, lora_request=None):
        self.lora_request = lora_request
        assert params.output_kind == "final" and params.seed is not None  # the finished turn only, seeded per turn
        self.events.append(f"add_request:{request_id}")

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert isinstance(method, str), "weight-sync methods are called by name (worker_extension_cls)"
        self.events.append(method)
        if method == "load_weight_bucket":
            for name, tensor in args[0]:
                self.loaded[name] = tensor.clone()
        if method == "load_adapter":  # (id, tensors, PEFT config)
            self.adapter = args
        answer = {"lora_targets_missing": [], "load_adapter": 1}.get(method, {"missing": []})
        return [answer] * self.kwargs["tensor_parallel_size"]

    def generate(self, prompts, sampling_params, *, use_tqdm=True, lora_request=None):
        self.events.append("generate")
        self.lora_request = lora_request
        eos = sampling_params[0].stop_token_ids[0]
        sample = SimpleNamespace(index=0, token_ids=[eos], logprobs=[{eos: SimpleNamespace(logprob=-0.1)}],
                                 finish_reason="stop")
        return [SimpleNamespace(outputs=[sample] * sp.n) for sp in sampling_params]

    def sleep(self, level=1):
        self.events.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.events.append("wake:" + ",".join(tags))

    def reset_prefix_cache(self):
        self.events.append("reset")
        return True


@pytest.fixture
def stand_in_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM = StandInLLM
    vllm.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # a TypedDict in vLLM
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = SimpleNamespace(FINAL_ONLY="final")
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("VLLM_ASCEND_ENABLE_NZ", raising=False)
    for key in ("LD_PRELOAD", "VLLM_DIST_IDENT"):  # set, then removed: the test's values are undone after it
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    emptied: list[str] = []
    monkeypatch.setattr("dockflow.engines.vllm_generation.empty_device_cache", emptied.append)
    return emptied


def _setup(device: str = "cuda", tp: int = 1, colocated: bool = True, lora: LoraConfig | None = None):
    from dockflow.engines.vllm_generation import VLLMGenerationEngine

    cfg = Config(engine={"backend": "vllm", "device": device, "vllm": {"tensor_parallel_size": tp,
                                                                        "weight_bucket_mb": 0.01}})
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model.tiny, tok, seed=0)
    if lora is not None:
        model = with_lora(model, lora, seed=0)
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed, lora)
    return tok, model, VLLMGenerationEngine(model, tok, inputs, colocated=colocated)


def test_colocated_sleep_sync_wake_order(stand_in_vllm):
    from dockflow.engines.vllm_generation import ColocatedTraining

    _, model, engine = _setup()
    assert engine.llm.kwargs["enable_sleep_mode"] and "enable_chunked_prefill" not in engine.llm.kwargs
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
    stand_in_vllm.clear()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    engine.load_weights(train.generation_weights())
    # the update's cached blocks go back to the device before vLLM takes its weights (TRL does the same)
    assert stand_in_vllm == ["cuda", "cuda"]
    assert llm.events[:2] == ["wake:weights", "begin_weight_sync"]
    assert llm.events[-3:] == ["finish_weight_sync", "wake:kv_cache", "reset"]
    assert set(llm.events[2:-3]) == {"load_weight_bucket"} and len(llm.events[2:-3]) > 1  # streamed in buckets
    assert torch.equal(llm.loaded["model.norm.weight"], model.model.norm.weight)
    llm.events.clear()
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=4), seed=0)
    assert llm.events == ["generate"]
    # a restored checkpoint (as a worker restores it; the torch engine's part is its state_dict): vLLM reloads
    # before it samples again
    train.load_state(None, 1, "actor", train.save_state(None, 1, "actor"))
    llm.events.clear()
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=4), seed=0)
    assert llm.events[-1] == "generate" and "load_weight_bucket" in llm.events


def test_a_tool_turn_stream_waits_for_the_synced_weights(stand_in_vllm):
    """Colocated on a device: a turn stream (tool rollouts) opened while vLLM sleeps without weights is refused
    like ``generate``; after the sync (which wakes vLLM) each turn is a request of its own."""
    from dockflow.engines.vllm_generation import ColocatedTraining

    tok, model, engine = _setup()
    train = ColocatedTraining(TorchTrainingEngine(model, lr=1e-3), engine)
    train.infer(engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, n=2), seed=0))
    params = SamplingParams(max_new_tokens=4, greedy=True)
    with pytest.raises(RuntimeError, match="level 2"):
        engine.turn_stream(tok, params, seed=0)
    engine.load_weights(train.generation_weights())  # wakes the weights, loads, wakes the KV cache
    engine.llm.events.clear()
    stream = engine.turn_stream(tok, params, seed=0)
    assert stream.submit(3, [1, 5, 6], 4) and stream.busy
    assert not stream.submit(4, [1, 5, 6], 0)  # no room: nothing asked of vLLM
    assert stream.submit(3, [1, 5, 6, 7], 3)  # its next turn: a request of its own, seeded apart
    assert engine.llm.events == ["add_request:turn-3-0", "add_request:turn-3-1"]


def test_tensor_parallel_uses_worker_processes_and_host_tensors(stand_in_vllm):
    _, model, engine = _setup(tp=2, colocated=False)
    kw = engine.llm.kwargs
    assert kw["distributed_executor_backend"] == "mp" and kw["tensor_parallel_size"] == 2
    assert not kw["enable_sleep_mode"] and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    # methods by name: nothing but tensors crosses to the worker processes, no insecure serialization needed
    assert kw["worker_extension_cls"] == "dockflow.engines.vllm_worker.WeightSyncWorker"
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in os.environ
    assert sorted(engine.llm.loaded) == sorted(dict(checkpoint_weights(model.named_parameters(), True)))
    engine.sleep()
    assert "sleep2" not in engine.llm.events


def test_settings_for_vllms_children_do_not_leak_into_the_workers(stand_in_vllm):
    """What vLLM writes into os.environ for the processes it spawns is undone once it has started, so a process
    the worker starts later (a torch.distributed spawn, a reward sandbox) does not preload its libgomp."""
    _setup(colocated=False)
    assert "LD_PRELOAD" not in os.environ and os.environ["VLLM_DIST_IDENT"] == "ident"


def test_ascend_turns_off_the_nz_weight_format(stand_in_vllm, monkeypatch):
    """vLLM-Ascend 0.23 raises in wake_up while its NZ format is on (its default): the engine turns it off before
    building vLLM. Stand-in at the boundary: no NPU here, and torch_npu's device check is not reached."""
    _, _, engine = _setup(device="npu")
    assert os.environ["VLLM_ASCEND_ENABLE_NZ"] == "0"
    assert engine.sleep_level == 2 and engine.llm.kwargs["enable_sleep_mode"]


def test_a_rank_that_missed_a_parameter_fails_the_sync(stand_in_vllm, monkeypatch):
    from dockflow.engines.sync_check import WeightSyncError

    _, model, engine = _setup(tp=2, colocated=False)
    reports = [{"missing": []}, {"missing": ["model.layers.0.mlp.down_proj.weight"]}]
    monkeypatch.setattr(engine.llm, "collective_rpc",
                        lambda method, args=(), **_: reports if method == "finish_weight_sync" else [2, 2])
    with pytest.raises(WeightSyncError, match=r"weight sync 1 did not take: .*model.layers.0.mlp.down_proj.weight"):
        engine.load_weights(model.named_parameters())


def test_a_worker_that_does_not_answer_fails_the_sync_after_the_stage_timeout(stand_in_vllm, monkeypatch):
    from dockflow.engines.sync_check import WeightSyncError

    _, model, engine = _setup(tp=2, colocated=False)
    seen = []

    def hung(method, timeout=None, args=(), kwargs=None):
        seen.append(timeout)
        raise TimeoutError  # what vLLM's multiprocess executor raises past the timeout

    monkeypatch.setattr(engine.llm, "collective_rpc", hung)
    with pytest.raises(WeightSyncError, match=r"did not finish begin_weight_sync within 1800 s \(train.stage_timeout_s\)"):
        engine.load_weights(model.named_parameters())
    assert seen == [1800.0]


def test_lora_syncs_send_the_adapter_and_the_base_again_only_after_sleep_dropped_it(stand_in_vllm, monkeypatch):
    """model.lora: the base loads once and each sync hands vLLM the adapter alone (a new id, which every request
    names); colocated at sleep level 2 vLLM dropped its weights, so such a sync loads the base again first."""
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, lora_id, lora_path: SimpleNamespace(name=name, id=lora_id, path=lora_path)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    monkeypatch.setattr("dockflow.engines.vllm_lora.lora_unsupported", lambda lora, architecture: None)
    _, model, engine = _setup(lora=LoraConfig(rank=4, alpha=8.0))
    llm = engine.llm
    assert (llm.kwargs["enable_lora"], llm.kwargs["max_lora_rank"], llm.kwargs["max_loras"]) == (True, 8, 1)
    assert "model.layers.0.self_attn.q_proj.weight" in llm.loaded  # the base, under the plain names
    assert llm.events[-3:] == ["finish_weight_sync", "load_adapter", "reset"]
    lora_id, tensors, config = llm.adapter
    assert lora_id == 1 and (config["r"], config["lora_alpha"]) == (4, 8.0)
    assert all(name.endswith((".lora_A.weight", ".lora_B.weight")) for name in tensors)
    llm.events.clear()
    engine.load_weights(iter(list(model.named_parameters())))  # awake: the adapter alone
    assert llm.events == ["load_adapter", "reset"] and llm.adapter[0] == 2
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=4), seed=0)
    assert llm.lora_request.id == 2
    engine.sleep()
    llm.events.clear()
    engine.load_weights(iter(list(model.named_parameters())))
    assert llm.events[:2] == ["wake:weights", "begin_weight_sync"]
    assert llm.events[-4:] == ["finish_weight_sync", "load_adapter", "wake:kv_cache", "reset"]
