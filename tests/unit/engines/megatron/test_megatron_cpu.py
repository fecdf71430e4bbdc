"""The CPU answers to megatron-core's CUDA assumptions: each fails here if megatron-core changes under it (the
attribute it replaces is gone, takes other parameters, or is no longer needed), and the answers undo on exit.
MindSpeed's adaptor order is checked with a stand-in module (MindSpeed itself is not installable here)."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types

import pytest
import torch

from dockflow.engines.megatron import cpu
from dockflow.engines.megatron.convert import spec_from_hf

CPU_ONLY = not torch.cuda.is_available()


def test_megatron_core_is_the_version_the_answers_were_measured_on():
    import megatron.core

    assert megatron.core.__version__ == cpu.MEGATRON_CORE_VERSION


def test_each_answer_replaces_an_existing_function_with_the_same_parameters():
    for owner, name, answer in cpu.cpu_answers():
        original = getattr(owner, name)
        assert callable(original), f"{owner.__name__}.{name}"
        assert list(inspect.signature(answer).parameters) == list(inspect.signature(original).parameters), name


@pytest.mark.skipif(not CPU_ONLY, reason="on a CUDA build the tracker needs no answer")
def test_the_rng_tracker_needs_the_answers_and_runs_on_the_cpu_generator_with_them():
    from megatron.core.tensor_parallel import random as mrandom

    seed = dict(tp_rank=0, ep_rank=0, etp_rank=0, force_reset_rng=True)
    with pytest.raises((RuntimeError, AssertionError, AttributeError)):
        mrandom.model_parallel_cuda_manual_seed(3, **seed)  # CPU torch: torch.cuda.manual_seed / get_rng_state
    before = torch.get_rng_state()
    with cpu.cuda_answered_on_cpu():
        mrandom.model_parallel_cuda_manual_seed(3, **seed)
        torch.manual_seed(11)
        outside = torch.get_rng_state()
        tracker = mrandom.get_cuda_rng_tracker()
        with tracker.fork():  # attention's dropout region: the model-parallel state (seed 3 + 2718 + tp_rank)
            first = torch.rand(3)
        assert torch.equal(torch.get_rng_state(), outside)  # fork gives the CPU generator back
        mrandom.model_parallel_cuda_manual_seed(3, **seed)  # a new tracker, seeded alike
        with mrandom.get_cuda_rng_tracker().fork():
            assert torch.equal(torch.rand(3), first)
    torch.set_rng_state(before)


def test_cuda_devices_map_to_cpu_inside_and_everything_is_restored_on_exit():
    originals = {name: getattr(torch.cuda, name) for name in ("current_device", "synchronize", "manual_seed")}
    with cpu.cuda_answered_on_cpu() as applied:
        assert torch.cuda.current_device() == "cpu"
        assert torch.zeros(2, device="cuda").device.type == "cpu"  # the pipeline schedules' buffers
        assert torch.zeros(2, device=torch.device("cuda", 0)).device.type == "cpu"
        t = torch.ones(2)
        assert t.cuda() is t  # the tied embedding's weight.data.cuda() with PP > 1
        assert t.to("cuda").device.type == "cpu" and t.to(torch.float64).dtype == torch.float64
        torch.cuda.synchronize()
    assert "CudaDevicesOnCpu" in applied and "torch.cuda.current_device" in applied
    for name, original in originals.items():
        assert getattr(torch.cuda, name) is original, name
    if CPU_ONLY:
        with pytest.raises((RuntimeError, AssertionError)):
            torch.zeros(1, device="cuda")


@pytest.mark.skipif(not CPU_ONLY, reason="on a CUDA build the dispatcher's streams need no answer")
def test_the_moe_dispatchers_host_copies_run_on_one_cpu_stream_and_give_gloo_plain_split_sizes():
    import megatron.core.transformer.moe.moe_utils as moe_utils
    from megatron.core.transformer.moe import token_dispatcher

    te_absent = not hasattr(moe_utils, "te_general_gemm")  # megatron reads it; defined only with Transformer Engine
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.cuda.Stream()
    splits = torch.tensor([3, 1])
    assert torch.is_tensor(token_dispatcher.maybe_move_tensor_to_cpu(splits, as_numpy=True))  # a CPU tensor stays
    with cpu.cuda_answered_on_cpu() as applied:
        side = torch.cuda.Stream()
        assert torch.cuda.current_stream() == side  # one stream: the dispatcher records nothing on a side stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            moved = token_dispatcher.maybe_move_tensor_to_cpu(splits, as_numpy=True, record_stream=False)
        side.record_event().synchronize()
        assert moved.tolist() == [3, 1] and not torch.is_tensor(moved)
        assert moe_utils.te_general_gemm is None
        assert ("megatron.core.transformer.moe.moe_utils.te_general_gemm" in applied) == te_absent
    assert hasattr(moe_utils, "te_general_gemm") != te_absent  # put back as it was


def test_config_turns_off_the_synchronising_p2p_and_the_fused_kernels():
    from megatron.core.transformer.transformer_config import TransformerConfig
    from transformers import Qwen2Config

    from dockflow.engines.megatron.model import transformer_config

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert {"batch_p2p_sync", "use_cpu_initialization", "qk_layernorm", "add_qkv_bias"} <= fields
    config = transformer_config(spec_from_hf(Qwen2Config(num_hidden_layers=2, num_attention_heads=4,
                                                         num_key_value_heads=2, hidden_size=32)))
    assert config.batch_p2p_sync is False and config.masked_softmax_fusion is False
    assert config.num_query_groups == 2 and config.add_qkv_bias and config.gated_linear_unit


def test_cuda_is_left_alone_and_an_unknown_device_is_one_error():
    assert cpu.prepare_megatron("cuda") == []
    with pytest.raises(ValueError, match="engine.device='tpu': megatron runs on cpu, cuda or npu"):
        cpu.prepare_megatron("tpu")


def _without_megatron(monkeypatch) -> None:
    for name in [n for n in sys.modules if n == "megatron" or n.startswith("megatron.")]:
        monkeypatch.delitem(sys.modules, name)


def test_npu_imports_mindspeeds_adaptor_before_megatron(monkeypatch):
    _without_megatron(monkeypatch)
    adaptor = types.ModuleType("mindspeed.megatron_adaptor")
    monkeypatch.setitem(sys.modules, "mindspeed", types.ModuleType("mindspeed"))
    monkeypatch.setitem(sys.modules, "mindspeed.megatron_adaptor", adaptor)
    assert cpu.apply_mindspeed_adaptor() == ["mindspeed.megatron_adaptor"]


def test_npu_refuses_once_megatron_is_imported_and_names_mindspeed_when_missing(monkeypatch):
    import megatron.core  # noqa: F401

    with pytest.raises(RuntimeError, match="megatron was imported before MindSpeed's adaptor"):
        cpu.apply_mindspeed_adaptor()
    _without_megatron(monkeypatch)
    monkeypatch.setitem(sys.modules, "mindspeed", None)  # import mindspeed -> ModuleNotFoundError
    with pytest.raises(RuntimeError, match="engine.device=npu needs MindSpeed"):
        cpu.apply_mindspeed_adaptor()
