"""The training engines on a real device, as one rank of a one-rank process group (nccl on CUDA, hccl on Ascend):
marked ``gpu`` / ``npu`` and skipped by default (``pytest -m gpu tests/integration/test_training_engines_device.py``;
docs/engines.md says where they ran). On the device, each engine is checked against ``TorchTrainingEngine`` on the
same device (the reference every CPU test uses), and that one against the CPU, on the same weights and batch:

- the torch engine and HF generation: log-probs and one GRPO update equal the CPU's; greedy tokens equal the CPU's;
- megatron-core (TP=1, PP=1; nothing patched on CUDA): log-probs and one GRPO update, allgather-swap leaving none
  of the update state on the device during generation, the memory ledger on the device's allocator, a
  ``dist_checkpointing`` run checkpoint resumed, ``save_pretrained``;
- megatron's value model (PPO's critic) and FSDP2: values / log-probs and one update.

Needs megatron-core and the package's own dependencies on the device machine; nothing else (no Ray, no vLLM).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fixtures.engine_batches import critic_batch, grpo_loss, rollout_batch, value_loss, with_old_log_probs
from fixtures.tiny_models import tiny_decoder

from dockflow.engines.devices import PROCESS_GROUP_BACKEND, accelerator_module
from dockflow.engines.logprobs import response_values
from dockflow.engines.torch_training import TorchTrainingEngine

DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu), pytest.param("npu", marks=pytest.mark.npu)]
NAMES = ("qwen2_tied", "qwen3")
ARGS = dict(lr=1e-3, weight_decay=0.1, grad_clip=0.5, infer_batch_size=3, temperature=0.7)
CRITIC_ARGS = dict(lr=1e-3, weight_decay=0.1, grad_clip=0.5, infer_batch_size=3)
SAME = 1e-5  # two engines on one device, fp32 (the CPU tests' bound)
HOST = 1e-4  # the device against the CPU: other kernels, other summation orders


@pytest.fixture(scope="module", params=DEVICES)
def device(request, tmp_path_factory):
    """One rank of a one-rank process group on the device's collective backend, fp32 kept exact (no TF32)."""
    name = request.param
    module = accelerator_module(name)
    assert module is not None and module.is_available(), f"no {name} device here"
    module.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group(PROCESS_GROUP_BACKEND[name], store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=120))
    yield name
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float, what: str) -> None:
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=atol, msg=what)


def _update(engine) -> dict:
    """Log-probs, one GRPO update (2 micro-batches, clipping that bites) and log-probs after it."""
    batch = rollout_batch()
    logp = engine.infer(batch)
    batch = with_old_log_probs(batch, logp)
    metrics = engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=2)
    weights = {n: w.detach().clone() for n, w in engine.named_weights()}
    return {"logp": logp, "metrics": metrics, "weights": weights, "logp_after": engine.infer(batch),
            "mask": batch["response_mask"], "batch": batch}


def _same_update(out: dict, ref: dict, atol: float, start: dict[str, torch.Tensor]) -> None:
    mask = ref["mask"]
    _close(out["logp"] * mask, ref["logp"] * mask, atol, "log-probs")
    _close(out["logp_after"] * mask, ref["logp_after"] * mask, atol, "log-probs after the update")
    assert ref["metrics"]["grad_norm"] > ARGS["grad_clip"]  # the clipping bites
    assert out["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=1e-4)
    for key, weight in ref["weights"].items():
        _close(out["weights"][key], weight, atol, key)
        assert not torch.equal(weight.cpu(), start[key]), key  # every weight moved


def test_torch_engine_and_hf_generation_equal_the_cpu(device):
    from dockflow.config import Config
    from dockflow.engines import EngineInputs, SamplingParams, create_engines
    from dockflow.models import build_char_tokenizer, build_tiny_model

    start = tiny_decoder("qwen2_tied").state_dict()
    on_device = _update(TorchTrainingEngine(tiny_decoder("qwen2_tied"), device=device, **ARGS))
    assert all(w.device.type == device for w in on_device["weights"].values())
    _same_update(on_device, _update(TorchTrainingEngine(tiny_decoder("qwen2_tied"), **ARGS)), HOST, start)

    prompts = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: "]
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    tok = build_char_tokenizer()
    outs = {}
    for where in ("cpu", device):
        cfg = Config(engine={"device": where})
        inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
        train, gen = create_engines(inputs, build_tiny_model(cfg.model.tiny, tok, seed=0), tok, device=where)
        out = gen.generate(prompts, greedy, seed=0, prompt_width=30)
        outs[where] = out
        mask = out["response_mask"].bool()
        _close(out["rollout_log_prob"][mask], train.infer(out)[mask], HOST, f"rollout log-probs on {where}")
    assert torch.equal(outs[device]["responses"], outs["cpu"]["responses"])


@pytest.mark.parametrize("name", NAMES)
def test_megatron_engine_on_the_device(device, name, tmp_path):
    from dockflow.engines.megatron.cpu import prepare_megatron
    from dockflow.engines.megatron.training import MegatronTrainingEngine
    from dockflow.reshard import measured_redundant_bytes, storage_bytes
    from dockflow.storage import LocalCheckpointStore

    engine = MegatronTrainingEngine(tiny_decoder(name), tp=1, pp=1, device=device, **ARGS)
    assert prepare_megatron(device) == ([] if device == "cuda" else ["mindspeed.megatron_adaptor"])
    assert all(p.device.type == device for p in engine.model.parameters())
    out = _update(engine)
    ref = _update(TorchTrainingEngine(tiny_decoder(name), device=device, **ARGS))
    _same_update(out, ref, SAME, tiny_decoder(name).state_dict())

    # Generation state: full HF weights on the device, the update weights, grads and AdamW state on the host.
    generation = [w for _, w in engine.generation_weights()]  # the reshard (the last infer swapped back)
    assert all(p.device.type == device for p in generation)
    assert storage_bytes(engine._local_weights.values(), torch.device(device)) == 0
    assert measured_redundant_bytes(engine._local_weights.values(), generation, device) == 0
    assert engine._arena.nbytes > 0 and engine._arena._host.is_pinned()  # one pinned arena, reused every swap
    memory = engine.memory_metrics()
    assert any(k.endswith("generation_weights_bytes") and v > 0 for k, v in memory.items()), sorted(memory)
    assert any(k.endswith("allocator_peak_bytes") for k in memory), sorted(memory)  # the device's allocator

    store = LocalCheckpointStore(tmp_path / "ckpt", keep=2)
    saved = engine.save_state(store, 1, "actor")  # dist_checkpointing from device tensors
    store.commit(1, {"iteration": 1})
    engine.train_mini_batch(out["batch"], grpo_loss(), micro_batch_size=2)
    second = {n: w.detach().clone() for n, w in engine.named_weights()}
    engine.load_state(store, 1, "actor", saved)
    for key, weight in engine.named_weights():
        _close(weight, out["weights"][key], 0.0, f"{key} as saved")
    engine.train_mini_batch(out["batch"], grpo_loss(), micro_batch_size=2)
    for key, weight in engine.named_weights():
        _close(weight, second[key], 1e-6, f"{key} after the resumed step")

    from transformers import AutoModelForCausalLM

    saved_dir = engine.save_pretrained(tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(saved_dir, dtype=torch.float32, local_files_only=True)
    for key, weight in reloaded.named_parameters():
        _close(weight, second[key], 0.0, f"saved {key}")


def test_megatron_critic_on_the_device(device, tmp_path):
    from dockflow.engines.megatron.value import MegatronCriticEngine
    from dockflow.models import build_char_tokenizer, load_critic, save_pretrained_dir

    save_pretrained_dir(tiny_decoder("qwen2_tied"), build_char_tokenizer(), tmp_path / "policy")

    def critic():
        model = load_critic(tmp_path / "policy")
        with torch.no_grad():  # a zero head passes no grad to the trunk
            model.score.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(5))
        return model

    outs = []
    for engine in (MegatronCriticEngine(critic(), tp=1, pp=1, device=device, **CRITIC_ARGS),
                   TorchTrainingEngine(critic(), response_fn=response_values, device=device, **CRITIC_ARGS)):
        values = engine.infer(critic_batch())
        batch = critic_batch(values)
        metrics = engine.train_mini_batch(batch, value_loss, micro_batch_size=2)
        outs.append({"values": values, "metrics": metrics, "after": engine.infer(batch), "mask": batch["response_mask"],
                     "weights": {n: w.detach().clone() for n, w in engine.policy_module().state_dict().items()}})
    out, ref = outs
    _close(out["values"] * ref["mask"], ref["values"] * ref["mask"], SAME, "values")
    _close(out["after"] * ref["mask"], ref["after"] * ref["mask"], SAME, "values after the update")
    assert out["metrics"]["critic/value_loss"] == pytest.approx(ref["metrics"]["critic/value_loss"], rel=1e-5)
    for key, weight in ref["weights"].items():
        _close(out["weights"][key], weight, SAME, key)


def test_fsdp_engine_on_the_device(device):
    from dockflow.engines.fsdp_training import FSDPTrainingEngine
    from dockflow.reshard import measured_redundant_bytes, storage_bytes

    engine = FSDPTrainingEngine(tiny_decoder("qwen2_tied"), device=device, **ARGS)
    out = _update(engine)
    ref = _update(TorchTrainingEngine(tiny_decoder("qwen2_tied"), device=device, **ARGS))
    _same_update(out, ref, SAME, tiny_decoder("qwen2_tied").state_dict())
    generation = [w for _, w in engine.generation_weights()]  # the reshard (the last infer swapped back)
    assert all(p.device.type == device for p in generation)
    assert storage_bytes(engine._local_weights.values(), torch.device(device)) == 0
    assert measured_redundant_bytes(engine._local_weights.values(), generation, device) == 0
    assert engine._arena.nbytes > 0 and engine._arena._host.is_pinned()


def test_cuda_answers_are_not_applied_in_this_process(device):
    """On a device nothing of ``megatron/cpu.py`` is in place: torch's own cuda functions answer."""
    if device != "cuda":
        pytest.skip("cuda only")
    assert torch.cuda.current_device.__module__ == "torch.cuda"
    assert Path(torch.cuda.synchronize.__code__.co_filename).parent.name == "cuda"
