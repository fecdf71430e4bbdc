"""LoRA on the torch engine (``model.lora``): only the adapters train, and as PEFT + plain torch train them; the
reference is the base model exactly; the merged export and the merged weight sync give the trainer's log-probs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fixtures.engine_batches import RESPONSE, grpo_loss, rollout_batch, with_old_log_probs
from fixtures.tiny_models import tiny_qwen2
from tensordict import TensorDict
from torch import nn

from dockflow.config import LoraConfig
from dockflow.engines import HFGenerationEngine, TorchTrainingEngine
from dockflow.engines.lora import (
    LoraError,
    adapter_tensors,
    causal_lm,
    check_targets,
    merge_adapters,
    merged_weights,
    save_lora_model,
    with_lora,
)
from dockflow.engines.sync_check import SyncChecker, WeightSyncError

LR, CLIP = 1e-2, 0.5
LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])


def lora_model(vocab_size: int = 40, seed: int = 0) -> nn.Module:
    """The tiny Qwen2 with adapters whose B is not zero (PEFT starts it at zero), so that switching the adapter
    off, merging it or training A changes something."""
    model = with_lora(tiny_qwen2(vocab_size), LORA, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model


def grpo_batch(engine: TorchTrainingEngine) -> TensorDict:
    """The fixture's rollouts with old and reference log-probs near the engine's current ones."""
    batch = rollout_batch()
    return with_old_log_probs(batch, engine.infer(batch))


def torch_step(model: nn.Module, batch: TensorDict) -> None:
    """One GRPO step the plain way: PEFT's forward over the whole batch, the recipe's loss over its tokens, the
    global-norm clip and AdamW on the trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    model.train()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    logp = F.log_softmax(logits[:, -RESPONSE - 1:-1], dim=-1).gather(-1, batch["responses"][..., None]).squeeze(-1)
    loss, _ = grpo_loss()(logp, batch, float(batch["response_mask"].sum()))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, CLIP)
    optimizer.step()


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "activation_checkpointing"])
def test_a_grpo_update_trains_only_the_adapters_as_peft_and_torch_do(checkpointing: bool):
    """Also with activations recomputed (``train.gradient_checkpointing``, what makes LoRA's memory saving show
    where activations dominate: ``benchmarks/lora.py --gradient-checkpointing``)."""
    model = lora_model()
    expected = copy.deepcopy(model)
    engine = TorchTrainingEngine(model, lr=LR, grad_clip=CLIP, gradient_checkpointing=checkpointing)
    assert causal_lm(model).is_gradient_checkpointing == checkpointing
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch = grpo_batch(engine)
    engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=2)  # two micro-batches, one step
    torch_step(expected, batch)
    adapters = {n for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all(".lora_" in n for n in adapters)
    assert len(engine.optimizer.state) == len(adapters)  # AdamW state for the adapters alone
    want = dict(expected.named_parameters())
    for name, p in model.named_parameters():
        if name in adapters:
            assert not torch.equal(p, before[name]), f"{name} did not train"
            torch.testing.assert_close(p.detach(), want[name].detach(), rtol=0, atol=1e-5, msg=name)
        else:
            assert torch.equal(p, before[name]), f"frozen {name} changed"


def test_reference_log_probs_with_the_adapter_off_are_the_base_models_exactly():
    lora = TorchTrainingEngine(lora_model(), lr=LR)
    base = TorchTrainingEngine(tiny_qwen2(40), lr=LR)
    batch = rollout_batch()
    reference = lora.infer_reference(batch)
    assert torch.equal(reference, base.infer(batch))
    assert not torch.allclose(lora.infer(batch), reference)  # the adapter is back on after the block
    with pytest.raises(NotImplementedError, match="model.lora is null"):
        base.infer_reference(batch)


def test_the_merged_export_loads_in_transformers_with_the_trainers_log_probs(tmp_path: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine = TorchTrainingEngine(lora_model(), lr=LR, grad_clip=CLIP)
    batch = grpo_batch(engine)
    engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=4)
    trained = engine.infer(batch)
    save_lora_model(engine.policy_module(), tmp_path)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(TorchTrainingEngine(merged, lr=LR).infer(batch), trained, rtol=0, atol=1e-5)
    adapter = tmp_path / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == LORA.rank
    reloaded = PeftModel.from_pretrained(tiny_qwen2(40), adapter, is_trainable=True)  # PEFT's format, on the base
    torch.testing.assert_close(TorchTrainingEngine(reloaded, lr=LR).infer(batch), trained, rtol=0, atol=1e-5)


def test_a_generator_takes_the_merged_weights_and_passes_the_sync_check(char_tok):
    vocab = len(char_tok)
    policy = lora_model(vocab)
    generator = HFGenerationEngine(tiny_qwen2(vocab), char_tok)  # a generator worker's plain base model
    checker = SyncChecker(every=1, sequences=3, length=12, tolerance=1e-5, seed=0)
    probe = checker.next_probe(policy, vocab)
    with pytest.raises(WeightSyncError):  # before the sync the generator holds the base weights
        generator.check_sync(probe)
    generator.load_weights(merged_weights(policy))
    assert generator.check_sync(probe) <= 1e-5
    colocated = HFGenerationEngine(policy, char_tok)  # HF generation on the LoRA module itself
    assert colocated.samples_with(policy)
    from dockflow.engines import SamplingParams

    out = colocated.generate(["1+2=", "3+4="], SamplingParams(max_new_tokens=4, n=2), seed=0)
    assert out["responses"].shape == (4, 4)
    mask = out["response_mask"]  # the rollout log-probs are the adapted policy's, as the trainer computes them
    trainer = TorchTrainingEngine(policy, lr=LR).infer(out)
    torch.testing.assert_close(out["rollout_log_prob"] * mask, trainer * mask, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        (LoraConfig(target_modules=["q_proj", "qkv"]),
         "model.lora.target_modules: 'qkv' matches no linear layer of the model; its linear layers are down_proj, "
         "gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"),
        (LoraConfig(rank=40, target_modules=["k_proj"]),
         "model.lora.rank=40 exceeds model.layers.0.self_attn.k_proj (32 -> 16): set model.lora.rank <= 16"),
        (LoraConfig(target_modules=["lm_head"]), "matches the output head 'lm_head'"),
    ],
)
def test_targets_that_do_not_fit_the_model_are_one_line(lora: LoraConfig, message: str):
    model = tiny_qwen2(40)
    with pytest.raises(LoraError) as err:
        check_targets(model, lora)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_vllms_merged_fallback_rebuilds_the_merged_weights_from_the_adapter_alone():
    """Where vLLM cannot take the adapter (``dockflow.engines.vllm_lora``), a generator merges the published adapter
    (PEFT's saved names) into its own plain base: the trainer's ``merged_weights``, bit for bit."""
    from dockflow.engines.vllm_lora import AdapterSync, lora_unsupported, peft_config

    policy = lora_model()
    adapters = adapter_tensors(policy.named_parameters())
    assert adapters and all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in adapters)
    assert len(adapters) == 2 * sum(".lora_A." in n for n, _ in policy.named_parameters())
    expected = dict(merged_weights(policy))
    sync = AdapterSync(LORA, tiny_qwen2(40), why_merged="stand-in")  # a generator's plain base model
    full, _ = sync.full_weights(iter(adapters.items()), base=False)
    got = dict(full)
    assert sorted(got) == sorted(expected) and all(torch.equal(got[n], expected[n]) for n in got)
    assert dict(merge_adapters(iter(got.items()), {}, 2.0)).keys() == got.keys()  # nothing to merge: as it was
    assert sync.engine_kwargs() == {} and sync.lora_request() is None
    assert peft_config(LORA) == {"r": 4, "lora_alpha": 8.0, "target_modules": LORA.target_modules, "bias": "none"}
    assert "above vLLM's largest max_lora_rank (512)" in lora_unsupported(LoraConfig(rank=513), "Qwen2ForCausalLM")
