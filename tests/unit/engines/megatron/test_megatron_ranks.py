"""Real megatron-core GPTModels on gloo ranks, loaded with converted HF weights, at TP=1 (one rank), TP=2,
PP=2 (two ranks) and TP2xPP2 (four ranks): their response log-probs (through megatron's pipeline schedule, and
called directly at PP=1) equal the HF model's (fp32, 1e-5), and so do the entropy, the loss on the log-probs and
its gradients (forward-backward through the schedule in 2 micro-batches, gathered from every rank's shard); the
schedule's head runs ``CHUNK`` tokens at a time, fewer than a micro-batch's and not dividing them, over a vocabulary
padded past a whole TP rank's shard. At TP=2 the chunked vocab-parallel head (``vocab_parallel_head``) equals the
whole vocab-parallel logits through megatron's ``vocab_parallel_cross_entropy`` (log-probs, entropy, the hidden
state's and the weight shard's gradients) on a vocabulary whose padding starts inside a shard. The shards gathered
back convert to the HF weights exactly.

megatron is imported once, in the fork server the ranks start from (``tests/fixtures/ranks.py``); each rank answers CUDA on CPU
(``cpu.prepare_megatron``) in its own process only.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fixtures.ranks import start_ranks
from fixtures.tiny_models import DECODERS, tiny_decoder

from dockflow.engines.logprobs import response_log_probs
from dockflow.engines.megatron.convert import hf_to_megatron, megatron_to_hf, spec_from_hf

RESPONSE = 5
CHUNK = 3  # tokens per head matmul: a micro-batch has 2 x 5 response positions


def rollout() -> tuple[torch.Tensor, torch.Tensor]:
    """4 rows of prompt 6 + response 5: left-padded prompts, responses of lengths 5, 3, 1, 5."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 40, (4, 6 + RESPONSE), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[2, :4] = 0
    for row, length in enumerate([5, 3, 1, 5]):
        mask[row, 6 + length:] = 0
    return ids, mask


def loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A stand-in policy-gradient loss: minus the summed response log-probs."""
    return -(logp * mask[:, -RESPONSE:]).sum()


def recording_loss(mask: torch.Tensor, entropy: torch.Tensor):
    """``loss`` as the schedule calls it, keeping each micro-batch's entropy in ``entropy`` [B, RESPONSE]."""

    def loss_fn(outputs, rows: slice) -> torch.Tensor:
        entropy[rows] = outputs.entropy.detach()
        return loss(outputs.values, mask[rows])

    return loss_fn


def _head_against_whole_logits(vocab_size: int = 200, temperature: float = 0.7) -> dict[str, torch.Tensor]:
    """(chunked - whole) for the log-probs, entropy and gradients of random hidden states [2, 7, 16] through this
    rank's 128-row shard of a random weight (vocabulary 200 padded to 256 at TP=2: rank 1 holds 72 real rows)."""
    from megatron.core import parallel_state, tensor_parallel

    from dockflow.engines.megatron.vocab_parallel_head import vocab_parallel_log_probs

    gen = torch.Generator().manual_seed(11)
    hidden, weight = torch.randn(2, 7, 16, generator=gen), torch.randn(256, 16, generator=gen)
    targets, upstream = torch.randint(0, vocab_size, (2, 7), generator=gen), torch.randn(2, 7, generator=gen)
    rank = parallel_state.get_tensor_model_parallel_rank()
    weight = weight[rank * 128 : (rank + 1) * 128]
    out = {}
    for way in ("whole", "chunked"):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if way == "whole":
            logits = tensor_parallel.copy_to_tensor_model_parallel_region(h) @ w.t() / temperature
            logits = logits.masked_fill(torch.arange(rank * 128, (rank + 1) * 128) >= vocab_size, float("-inf"))
            full = tensor_parallel.gather_from_tensor_model_parallel_region(logits.detach())
            entropy = torch.special.entr(full.softmax(-1)).sum(-1)
            logp = -tensor_parallel.vocab_parallel_cross_entropy(logits, targets)
        else:
            logp, entropy = vocab_parallel_log_probs(h, w, targets, vocab_size, temperature=temperature, chunk=4)
        (logp * upstream).sum().backward()
        out[way] = {"logp": logp.detach(), "entropy": entropy, "hidden_grad": h.grad, "weight_grad": w.grad}
    return {key: out["chunked"][key] - out["whole"][key] for key in out["whole"]}


def _rank(rank: int, layout: tuple[int, int], store_path: str, out_dir: str) -> None:
    from megatron.core import parallel_state

    from dockflow.engines.megatron import model as mg
    from dockflow.engines.megatron.schedule import (
        finalize_grads,
        pipeline_forward_backward,
        pipeline_response_log_probs,
        policy_head,
    )

    tp, pp = layout
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, tp * pp)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=tp * pp, timeout=timedelta(seconds=60))
    applied = mg.init_model_parallel(tp=tp, pp=pp, seed=0, device="cpu")
    ids, mask = rollout()
    result = {"applied": applied, "layout": layout, "last_stage": parallel_state.is_pipeline_last_stage()}
    if tp > 1:
        result["head_vs_whole"] = _head_against_whole_logits()
    for name in DECODERS:
        hf = tiny_decoder(name)
        spec = spec_from_hf(hf.config)
        model = mg.build_gpt_model(spec, tp=tp, pp=pp)
        mg.load_full_state(model, hf_to_megatron(hf.state_dict(), spec), spec)
        model.eval()
        head = policy_head(spec.vocab_size, chunk=CHUNK)
        logp = pipeline_response_log_probs(model, ids, mask, RESPONSE, spec.vocab_size, micro_batch_size=2, head=head)
        local = {n: tuple(p.shape) for n, p in model.named_parameters()}
        result[name] = {"logp": logp, "hf": megatron_to_hf(mg.gather_full_state(model, spec), spec), "local": local}
        if pp == 1:
            with torch.no_grad():
                result[name]["direct_logp"] = mg.response_log_probs(model, ids, mask, RESPONSE, spec.vocab_size)
        model.train()  # dropout 0: the RNG tracker forks the CPU generator
        entropy = torch.zeros(ids.shape[0], RESPONSE)
        result[name]["loss"] = pipeline_forward_backward(
            model, ids, mask, RESPONSE, spec.vocab_size, micro_batch_size=2, loss_fn=recording_loss(mask, entropy),
            head=head)
        if result["last_stage"]:
            result[name]["entropy"] = entropy
        finalize_grads(model, spec)
        grads = mg.gather_full({n: p.grad for n, p in model.named_parameters()}, spec)
        result[name]["grads"] = megatron_to_hf(grads, spec)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    mg.destroy_model_parallel()
    dist.destroy_process_group()


def _launch(tmp: Path, layout: tuple[int, int]) -> list[dict]:
    world = layout[0] * layout[1]
    start_ranks(_rank, (layout, str(tmp / "store"), str(tmp)), world)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module", params=[(1, 1), (2, 1), (1, 2), (2, 2)], ids=["tp1", "tp2", "pp2", "tp2pp2"])
def ranks(request, tmp_path_factory) -> list[dict]:
    tp, pp = request.param
    return _launch(tmp_path_factory.mktemp(f"megatron_tp{tp}pp{pp}"), request.param)


@functools.cache
def hf_reference(name: str) -> dict:
    """The HF model's weights, response log-probs and gradients of ``loss`` (once per layout for every launch)."""
    ids, mask = rollout()
    hf = tiny_decoder(name)
    logp, entropy = response_log_probs(hf, ids, mask, RESPONSE)
    loss(logp, mask).backward()
    grads = {n: p.grad for n, p in hf.named_parameters()}
    if hf.config.tie_word_embeddings:
        grads["lm_head.weight"] = grads["model.embed_tokens.weight"]
    return {"logp": logp.detach(), "entropy": entropy, "state": hf.state_dict(), "grads": grads,
            "loss": float(loss(logp.detach(), mask))}


@pytest.mark.parametrize("name", list(DECODERS))
def test_megatron_log_probs_equal_hf(ranks, name):
    _, mask = rollout()
    expected = hf_reference(name)["logp"]
    response_mask = mask[:, -RESPONSE:]
    for r in ranks:
        torch.testing.assert_close(r[name]["logp"] * response_mask, expected * response_mask, rtol=0, atol=1e-5)
        if "direct_logp" in r[name]:  # PP=1: the model called directly, not through the schedule
            torch.testing.assert_close(r[name]["direct_logp"] * response_mask, expected * response_mask, rtol=0,
                                       atol=1e-5)
        assert ("entropy" in r[name]) == r["last_stage"]
        if "entropy" in r[name]:  # from the forward-backward
            torch.testing.assert_close(r[name]["entropy"] * response_mask,
                                       hf_reference(name)["entropy"] * response_mask, rtol=0, atol=1e-5)
        for key, tensor in hf_reference(name)["state"].items():
            assert torch.equal(r[name]["hf"][key], tensor), key


@pytest.mark.parametrize("name", list(DECODERS))
def test_megatron_gradients_gathered_from_the_shards_equal_hf(ranks, name):
    grads = hf_reference(name)["grads"]
    for r in ranks:
        assert r[name]["loss"] == pytest.approx(hf_reference(name)["loss"], rel=1e-6)
        assert r[name]["grads"].keys() == grads.keys()
        for key, grad in grads.items():
            torch.testing.assert_close(r[name]["grads"][key], grad, rtol=1e-5, atol=1e-5, msg=key)


def test_chunked_vocab_parallel_head_equals_the_whole_logits(ranks):
    tp = ranks[0]["layout"][0]
    for r in ranks:  # at TP=1 the head is the whole vocabulary: the HF comparisons cover it
        assert ("head_vs_whole" in r) == (tp > 1)
        for key, diff in r.get("head_vs_whole", {}).items():
            assert float(diff.abs().max()) <= 1e-5, key


def test_ranks_hold_their_shards_and_answer_cuda_on_cpu(ranks):
    tp, pp = ranks[0]["layout"]
    first, last = ranks[0], ranks[-1]  # megatron's rank order: TP fastest, then the pipeline stages
    untied = first["qwen2_untied"]["local"]
    assert untied["decoder.layers.0.self_attention.linear_qkv.weight"] == (64 // tp, 32)  # 2 groups x (2q+k+v) x 8
    assert untied["decoder.layers.0.mlp.linear_fc2.weight"] == (32, 48 // tp)
    assert untied["embedding.word_embeddings.weight"] == (128, 32)  # vocab 40 padded to 128 x tp, split in tp
    assert last["qwen2_untied"]["local"]["output_layer.weight"] == (128, 32)
    assert ("decoder.layers.1.mlp.linear_fc1.weight" in untied) == (pp == 1)  # one layer per stage at PP=2
    assert ("embedding.word_embeddings.weight" in last["qwen2_untied"]["local"]) == (pp == 1)
    # tied: no output_layer at PP=1; at PP=2 the last stage keeps its own copy of the embedding
    assert ("output_layer.weight" in last["qwen2_tied"]["local"]) == (pp > 1)
    for r in ranks:
        assert "torch.cuda.current_device" in r["applied"] and "CudaDevicesOnCpu" in r["applied"]
