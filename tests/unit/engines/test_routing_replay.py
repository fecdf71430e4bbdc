"""Routing replay (``dockflow.engines.routing``): the HF engine records each position's experts as a full forward
routes them; with replay on, the trainer's experts are the recorded ones exactly (packed or through the shared-prompt
pass), its gate weights its own softmax at those ids, and its log-probs follow them; -1 positions route themselves;
the mismatch metric counts the trainer's own top-k against the recorded one.

Model A generates; model B is A with its routers perturbed, so B's own top-k differs from A's on many entries."""

from __future__ import annotations

import copy

import pytest
import torch

from dockflow.config import Config
from dockflow.engines import HFGenerationEngine, SamplingParams, TorchTrainingEngine
from dockflow.engines.logprobs import position_ids_from_mask, response_log_probs
from dockflow.engines.routing import (
    MISMATCH,
    NOT_RECORDED,
    RouterReplay,
    Routing,
    RoutingRecorder,
    check_recording,
    moe_routers,
)
from dockflow.models import build_char_tokenizer, build_tiny_model

TOK = build_char_tokenizer()
PROMPTS = ["12+3=", "7*8=", "100-45=", "6+6="]
ATOL = 1e-5  # fp32: the same sums in another layout


def _moe(seed: int = 0):
    tiny = Config(model={"tiny": {"architecture": "qwen3_moe", "num_layers": 2, "hidden_size": 64,
                                  "intermediate_size": 128, "moe_intermediate_size": 32}}).model.tiny
    return build_tiny_model(tiny, TOK, seed=seed)


@pytest.fixture(scope="module")
def rollout():
    """Model A and a batch it generated (2 samples per prompt), with its recorded ``routed_experts``."""
    model = _moe()
    out = HFGenerationEngine(model, TOK).generate(PROMPTS, SamplingParams(max_new_tokens=6, n=2), seed=1)
    return model, out


@pytest.fixture(scope="module")
def perturbed(rollout):
    """Model B: A with noise on every router."""
    model = copy.deepcopy(rollout[0])
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for router in moe_routers(model):
            router.weight.add_(0.5 * router.weight.std() * torch.randn(router.weight.shape, generator=gen))
    return model


def _full_forward_routing(model, ids, mask) -> torch.Tensor:
    """[B, T, L, K]: the routers' own top-k in one forward over the whole rows."""
    with RoutingRecorder(model, moe_routers(model)) as rec, torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    return rec.routed(ids.shape[1]).long()


def _same_sets(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.sort(-1).values == b.sort(-1).values).all(-1)


def _experts_seen(model):
    """Hooks keeping the (ids, weights) each layer's experts received, and the routers' own ids (before replay)."""
    seen: dict[str, list] = {"ids": [], "weights": [], "own": [], "logits": []}

    def experts(_m, args, _out) -> None:
        seen["ids"].append(args[1])
        seen["weights"].append(args[2])

    def router(_m, _args, out) -> None:
        seen["own"].append(out[2])
        seen["logits"].append(out[0])

    hooks = [m.register_forward_hook(experts) for m in model.modules() if type(m).__name__ == "Qwen3MoeExperts"]
    return seen, hooks + [r.register_forward_hook(router, prepend=True) for r in moe_routers(model)]


def test_recorded_routing_equals_a_full_forward(rollout):
    model, out = rollout
    routed, mask = out["routed_experts"], out["attention_mask"]
    assert routed.dtype == torch.int16 and routed.shape == (*out["input_ids"].shape, 2, 2)
    recorded = routed[..., 0, 0] != NOT_RECORDED
    # every real position is recorded but the last step's tokens (sampled, never fed back); padding never
    fed = out["input_ids"].shape[1] - out["responses"].shape[1] + int(out["response_length"].max()) - 1
    assert torch.equal(recorded, mask.bool() & (torch.arange(mask.shape[1]) < fed))
    full = _full_forward_routing(model, out["input_ids"], mask)
    assert bool(_same_sets(full, routed.long())[recorded].all())


def test_replay_uses_the_recorded_experts_and_the_trainers_own_gate_weights(rollout, perturbed):
    _, out = rollout
    perturbed = copy.deepcopy(perturbed)  # the hooks stay on this copy
    replay = RouterReplay.attach(perturbed, replay=True)
    seen, hooks = _experts_seen(perturbed)
    try:
        ids, mask, width = out["input_ids"], out["attention_mask"], out["responses"].shape[1]
        with torch.no_grad():
            response_log_probs(perturbed, ids, mask, width, pack=True, routing=Routing(replay, out["routed_experts"]))
    finally:
        for h in hooks:
            h.remove()
    real = mask.reshape(-1).bool()  # the packed pass: the real tokens in row order
    given = out["routed_experts"].reshape(-1, 2, 2)[real].long()
    recorded = given[:, 0, 0] != NOT_RECORDED
    for layer in range(2):
        used, own = seen["ids"][layer], seen["own"][layer]
        want = torch.where(recorded[:, None], given[:, layer], own)
        assert torch.equal(used, want)  # the recorded ids exactly, own top-k where -1
        probs = torch.softmax(seen["logits"][layer].float(), dim=-1).gather(-1, want)
        torch.testing.assert_close(seen["weights"][layer], probs / probs.sum(-1, keepdim=True), atol=0, rtol=0)
    assert replay.stats.mismatched > 0  # B's own choice differs from A's: counted though replayed


def test_replayed_log_probs_follow_the_routing(rollout, perturbed):
    """B replaying its own routing scores as B; replaying A's it scores otherwise; A replaying A's scores as A."""
    model, out = rollout
    batch = out.select("input_ids", "attention_mask", "responses", "response_mask")
    own_b = _full_forward_routing(perturbed, batch["input_ids"], batch["attention_mask"]).to(torch.int16)
    own_b = own_b.masked_fill(~batch["attention_mask"].bool()[..., None, None], NOT_RECORDED)
    b = TorchTrainingEngine(copy.deepcopy(perturbed), lr=1e-3, router_replay=True)
    plain_b = b.infer(batch)
    torch.testing.assert_close(b.infer(batch.update({"routed_experts": own_b})), plain_b, atol=ATOL, rtol=0)
    replayed = b.infer(batch.update({"routed_experts": out["routed_experts"]}))
    assert float((replayed - plain_b).abs().max()) > 1e-3
    a = TorchTrainingEngine(copy.deepcopy(model), lr=1e-3, router_replay=True)
    torch.testing.assert_close(a.infer(batch), out["rollout_log_prob"], atol=ATOL, rtol=0)


def test_the_mismatch_metric_whichever_the_setting(rollout, perturbed):
    model, out = rollout
    batch = out.select("input_ids", "attention_mask", "responses", "response_mask", "routed_experts")
    for replay in (False, True):
        b = TorchTrainingEngine(copy.deepcopy(perturbed), lr=1e-3, router_replay=replay)
        b.infer(batch)
        assert b.routing_stats().metrics()[MISMATCH] > 0.05
        assert b.routing_stats().metrics() == {}  # taken: counted afresh
    a = TorchTrainingEngine(copy.deepcopy(model), lr=1e-3)
    a.infer(batch)
    assert a.routing_stats().metrics() == {MISMATCH: 0.0}


def test_minus_one_positions_route_themselves(rollout, perturbed):
    _, out = rollout
    batch = out.select("input_ids", "attention_mask", "responses", "response_mask")
    b = TorchTrainingEngine(copy.deepcopy(perturbed), lr=1e-3, router_replay=True)
    unrecorded = torch.full_like(out["routed_experts"], NOT_RECORDED)
    torch.testing.assert_close(b.infer(batch.update({"routed_experts": unrecorded})), b.infer(batch), atol=0, rtol=0)
    assert b.routing_stats().recorded == 0


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_equals_padded_under_replay_with_gradients_through_the_gates(rollout, perturbed, checkpointing):
    """Rows of one prompt with different recorded routing (A's on even rows, B's own on odd ones) do not share a
    prompt pass; the padded and packed passes give the same log-probs and gradients, the routers' included. Under
    gradient checkpointing (always packed in training) the recomputed layers replay the same routing."""
    _, out = rollout
    ids, mask, width = out["input_ids"], out["attention_mask"], out["responses"].shape[1]
    own_b = _full_forward_routing(perturbed, ids, mask).to(torch.int16).masked_fill(~mask.bool()[..., None, None], -1)
    mixed = out["routed_experts"].clone()
    mixed[1::2] = own_b[1::2]
    results = []
    for pack in (False, True):
        model = copy.deepcopy(perturbed).train()
        if pack and checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        replay = RouterReplay.attach(model, replay=True)
        logp = response_log_probs(model, ids, mask, width, pack=pack, routing=Routing(replay, mixed)).values
        (logp * out["response_mask"]).sum().backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (padded, padded_grads), (packed, packed_grads) = results
    torch.testing.assert_close(packed, padded, atol=ATOL, rtol=0)
    assert packed_grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=ATOL, rtol=1e-4, msg=name)
    router_grads = [padded_grads[n] for n in padded_grads if n.endswith("mlp.gate.weight")]
    assert len(router_grads) == 2 and all(float(g.abs().sum()) > 0 for g in router_grads)


def test_a_train_step_replays_and_leaves_generation_free(rollout, perturbed):
    _, out = rollout
    batch = out.select("input_ids", "attention_mask", "responses", "response_mask", "routed_experts")
    batch["advantages"] = torch.linspace(-1, 1, batch.batch_size[0])
    batch["old_log_prob"] = out["rollout_log_prob"]
    engine = TorchTrainingEngine(copy.deepcopy(perturbed), lr=1e-2, router_replay=True)
    before = [r.weight.detach().clone() for r in moe_routers(engine.model)]

    def loss_fn(logp, micro, tokens):
        return -(logp * micro["advantages"][:, None] * micro["response_mask"]).sum() / tokens, {}

    engine.train_mini_batch(batch, loss_fn, micro_batch_size=4)
    assert all(not torch.equal(b, r.weight) for b, r in zip(before, moe_routers(engine.model), strict=True))
    assert engine.routing_stats().recorded > 0
    assert engine.router._current is None  # nothing fed stays for the next generation on this module


def test_one_line_errors():
    dense = build_tiny_model(Config().model.tiny, TOK, seed=0)
    with pytest.raises(ValueError, match="train.router_replay=replay needs a mixture-of-experts policy"):
        RouterReplay.attach(dense, replay=True)
    assert RouterReplay.attach(dense, replay=False) is None
    with pytest.raises(ValueError, match="HFGenerationEngine records"):
        check_recording(True, HFGenerationEngine(dense, TOK))
    check_recording(False, HFGenerationEngine(dense, TOK))
    assert "routed_experts" not in HFGenerationEngine(dense, TOK).generate(["1+1="], SamplingParams(2), seed=0).keys()
