"""Padding-free packing (``dockflow.engines.packing``) gives the shared-prompt pass's log-probs and gradients within
1e-5 in fp32 on the HF decoders (Qwen2 tied and untied, Qwen3, Llama, Qwen3-MoE) and for a critic's value head;
gradient checkpointing (which packs) leaves the same gradients; the layout choice follows the cost."""

import pytest
import torch
from fixtures.engine_batches import rollout_batch
from fixtures.tiny_models import DECODERS, tiny_decoder

from dockflow.engines.logprobs import _trimmed, last_hidden, model_logits, packs, response_outputs
from dockflow.engines.packing import PackingCost, packed_outputs, packed_rows, packing_pays
from dockflow.engines.token_head import chunked_log_probs, output_head

ATOL = 1e-5  # fp32: the same sums over another attention layout


def _log_probs(model, batch, layout):
    ids, mask, keep_r = _trimmed(batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1])
    hidden = layout(model, ids, mask, keep_r, run=last_hidden)
    head = output_head(model)
    return chunked_log_probs(hidden, head.weight, head.bias, ids[:, -keep_r:], temperature=0.7, chunk=4)[0], keep_r


def _logp_and_grads(model, batch, layout):
    model.zero_grad(set_to_none=True)
    logp, keep_r = _log_probs(model, batch, layout)
    mask = batch["response_mask"][:, :keep_r]
    ((logp * mask).sum() * 0.1).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return (logp * mask).detach(), grads


@pytest.mark.kernels
@pytest.mark.parametrize("name", [*DECODERS, "qwen3_moe"])
def test_packed_log_probs_and_gradients_equal_the_padded_pass(name):
    if name == "qwen3_moe":
        from dockflow.config import Config
        from dockflow.models import build_char_tokenizer, build_tiny_model

        model = build_tiny_model(Config(model={"tiny": {"architecture": "qwen3_moe"}}).model.tiny,
                                 build_char_tokenizer(), seed=0)
    else:
        model = tiny_decoder(name)
    model.train()
    batch = rollout_batch(vocab_size=40)
    ref_logp, ref_grads = _logp_and_grads(model, batch, response_outputs)
    logp, grads = _logp_and_grads(model, batch, packed_outputs)
    torch.testing.assert_close(logp, ref_logp, atol=ATOL, rtol=0)
    assert grads.keys() == ref_grads.keys()
    for key, grad in ref_grads.items():
        torch.testing.assert_close(grads[key], grad, atol=ATOL, rtol=1e-4, msg=key)


def test_packed_critic_values_equal_the_padded_pass():
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    torch.manual_seed(0)
    critic = Qwen2ForTokenClassification(Qwen2Config(vocab_size=40, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2,
                                                     intermediate_size=48, num_labels=1)).eval()
    batch = rollout_batch()
    ids, mask, keep_r = _trimmed(batch["input_ids"], batch["attention_mask"], 5)
    real = batch["response_mask"][:, :keep_r].unsqueeze(-1)
    with torch.no_grad():
        padded = response_outputs(critic, ids, mask, keep_r, run=model_logits)
        packed = packed_outputs(critic, ids, mask, keep_r, run=model_logits)
    torch.testing.assert_close(packed * real, padded * real, atol=ATOL, rtol=0)


def test_gradient_checkpointing_packs_and_leaves_the_same_gradients():
    model = tiny_decoder("qwen2_untied").train()
    batch = rollout_batch()
    ref_logp, ref_grads = _logp_and_grads(model, batch, response_outputs)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids, mask, keep_r = _trimmed(batch["input_ids"], batch["attention_mask"], 5)
    assert packs(model, ids, mask, keep_r)  # the shared-prompt pass needs the KV cache checkpointing drops
    logp, grads = _logp_and_grads(model, batch, packed_outputs)
    torch.testing.assert_close(logp, ref_logp, atol=ATOL, rtol=0)
    for key, grad in ref_grads.items():
        torch.testing.assert_close(grads[key], grad, atol=ATOL, rtol=1e-4, msg=key)


def test_packed_rows_restart_positions_per_sequence():
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    index, positions = packed_rows(mask)
    assert index.tolist() == [1, 2, 3, 5, 6, 7, 8, 9]
    assert positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4]


def test_packing_pays_where_padding_outweighs_its_attention():
    # 16 rows, one long: padded to the longest, the short rows are mostly padding
    long_tail = torch.zeros(16, 512, dtype=torch.long)
    long_tail[:, :40] = 1
    long_tail[0] = 1
    cpu = PackingCost(pairs_per_position=3 * 128, varlen=False)  # the demo's model on CPU
    assert packing_pays(long_tail, keep_r=480, shared_positions=16 * 512, cost=cpu)
    # rows of one length sharing one prompt: the shared-prompt pass computes the prompt once and pads nothing
    even = torch.ones(16, 512, dtype=torch.long)
    assert not packing_pays(even, keep_r=480, shared_positions=32 + 16 * 480, cost=cpu)
    # varlen attention (flash-attention on CUDA) computes each sequence's own blocks: packing costs its tokens
    assert packing_pays(even, keep_r=480, shared_positions=32 + 16 * 480, cost=cpu._replace(varlen=True)) is False
    assert packing_pays(long_tail[:, :100], keep_r=60, shared_positions=16 * 100, cost=cpu._replace(varlen=True))


def test_an_update_with_gradient_checkpointing_leaves_the_same_weights():
    from fixtures.engine_batches import grpo_loss, with_old_log_probs

    from dockflow.engines.torch_training import TorchTrainingEngine

    weights = []
    for checkpointing in (False, True):
        engine = TorchTrainingEngine(tiny_decoder("qwen3"), lr=1e-2, gradient_checkpointing=checkpointing)
        batch = with_old_log_probs(rollout_batch(), engine.infer(rollout_batch()))
        engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=2)
        weights.append(dict(engine.model.named_parameters()))
    assert weights[1]["model.layers.0.mlp.up_proj.weight"].requires_grad
    for name, weight in weights[0].items():  # AdamW's first step is ~lr * sign(grad): rounding noise on a tiny
        torch.testing.assert_close(weights[1][name], weight, rtol=0, atol=1e-4, msg=name)  # grad moves it ~lr
