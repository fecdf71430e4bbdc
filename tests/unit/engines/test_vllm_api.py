"""The vLLM names and signatures the engine relies on, checked against the installed ``vllm`` (no device needed).
Skipped where vLLM is not installed (this project's CPU venv); run in the CUDA image, or any environment with
``vllm`` (it passed against vLLM 0.33.0 installed without its dependencies next to torch 2.13.0+cpu)."""

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


def test_engine_kwargs_are_engine_args():
    from vllm.engine.arg_utils import EngineArgs

    cfg = Config(engine={"backend": "vllm", "device": "cuda", "vllm": {"tensor_parallel_size": 2, "max_model_len": 64}})
    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    kwargs = engine_kwargs(cfg.engine.vllm, "/model", "float32", 0, 2)
    assert set(kwargs) <= set(fields)
    assert "processed_logprobs" in str(fields["logprobs_mode"].type)


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
