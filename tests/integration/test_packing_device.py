"""Packing, gradient checkpointing and the chunked head on a CUDA device (marked ``gpu``, skipped by default:
``pytest -m gpu tests/integration/test_packing_device.py``; docs/engines.md says where it ran).

- packed log-probs and gradients equal the padded (shared-prompt) pass on the device, fp32 with TF32 off, with
  sdpa and, where flash-attn is installed, with flash-attention 2's varlen kernel (bf16, its only dtypes);
- a checkpointed update leaves the same weights;
- at Qwen2.5's vocabulary the chunked log-probs' and update's peak device memory stays under 0.15x the fp32 logits.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.engine_batches import grpo_loss, rollout_batch, with_old_log_probs
from fixtures.tiny_models import tiny_decoder

from dockflow.engines.logprobs import _trimmed, last_hidden, response_log_probs, response_outputs
from dockflow.engines.packing import packed_outputs
from dockflow.engines.torch_training import TorchTrainingEngine

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def exact_fp32():
    assert torch.cuda.is_available(), "no cuda device here"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _hidden_and_grads(model, batch, layout):
    ids, mask, keep_r = _trimmed(batch["input_ids"].cuda(), batch["attention_mask"].cuda(), 5)
    model.zero_grad(set_to_none=True)
    hidden = layout(model, ids, mask, keep_r, run=last_hidden)
    real = batch["response_mask"][:, :keep_r].cuda().unsqueeze(-1)
    (hidden.float() * real).square().sum().backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return (hidden * real).float().detach(), grads


@pytest.mark.parametrize("attention", ["sdpa", "flash_attention_2"])
@pytest.mark.parametrize("name", ["qwen2_tied", "llama"])
def test_packed_equals_padded_on_the_device(name, attention):
    dtype, atol = torch.float32, 1e-5
    if attention == "flash_attention_2":
        pytest.importorskip("flash_attn", reason="flash-attn is not installed on this device machine")
        dtype, atol = torch.bfloat16, 2e-2  # flash-attention runs in half precision only
    model = tiny_decoder(name).to("cuda", dtype).train()
    model.config._attn_implementation = attention
    batch = rollout_batch()
    padded_model = tiny_decoder(name).to("cuda", dtype).train()  # the padded pass needs a mask: sdpa
    padded_model.config._attn_implementation = "sdpa"
    ref, ref_grads = _hidden_and_grads(padded_model, batch, response_outputs)
    got, grads = _hidden_and_grads(model, batch, packed_outputs)
    torch.testing.assert_close(got, ref, atol=atol, rtol=0)
    for key, grad in ref_grads.items():
        torch.testing.assert_close(grads[key], grad, atol=atol * 10, rtol=1e-3, msg=key)


def test_a_checkpointed_update_leaves_the_same_weights_on_the_device():
    weights = []
    for checkpointing in (False, True):
        engine = TorchTrainingEngine(tiny_decoder("qwen3"), lr=1e-2, device="cuda",
                                     gradient_checkpointing=checkpointing)
        batch = with_old_log_probs(rollout_batch(), engine.infer(rollout_batch()))
        engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=2)
        weights.append({n: p.detach().cpu() for n, p in engine.model.named_parameters()})
    for name, weight in weights[0].items():
        torch.testing.assert_close(weights[1][name], weight, rtol=0, atol=1e-4, msg=name)


def test_chunked_peak_memory_at_a_real_vocabulary():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    rows, width, vocab = 16, 2048, 151_936
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=4096)).cuda()
    ids = torch.randint(0, vocab, (rows, 16 + width), device="cuda")
    mask = torch.ones_like(ids)
    logits_mb = rows * width * vocab * 4 / 2**20
    peaks = {}
    for mode in ("logprobs", "update"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.set_grad_enabled(mode == "update"):
            logp = response_log_probs(model, ids, mask, width).values
            if mode == "update":
                logp.mean().backward()
        torch.cuda.synchronize()
        peaks[mode] = (torch.cuda.max_memory_allocated() - base) / 2**20
        model.zero_grad(set_to_none=True)
        del logp
    print(f"16 x 2048 at V={vocab}: fp32 logits {logits_mb:.0f} MiB; peak growth log-probs {peaks['logprobs']:.0f} "
          f"MiB ({peaks['logprobs'] / logits_mb:.3f}x), update {peaks['update']:.0f} MiB "
          f"({peaks['update'] / logits_mb:.3f}x)")
    assert peaks["logprobs"] < 0.15 * logits_mb and peaks["update"] < 0.15 * logits_mb
