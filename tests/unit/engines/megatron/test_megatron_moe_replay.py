"""Routing replay on ``MegatronTrainingEngine`` (``engines/megatron/expert_routing.py``) at EP=2 on two gloo ranks, each its
DP share of the batch (the all-to-all dispatcher moving unequal token counts):

- the routing the engine's routers chose (``last_routing``), fed back as the batch's ``routed_experts``, gives
  bit-identical log-probs, and ``moe/routing_mismatch`` is 0;
- another routing (every token's experts rolled by one) changes the log-probs; the experts the routers used equal it
  exactly, and the mismatch is 1; where a row of the column is -1 the router keeps its own top-k;
- the replayed log-probs equal a plain transformers forward of the same weights (one process, every expert) whose
  routers are forced to the same experts, within 1e-5; the GRPO gradients of a step under replay equal that
  forward's within float32 rounding (``fixtures/tolerances.py``), with and without activation recompute (the
  backward's recomputed forward routes by the same target);
- the load-balancing loss (``moe_aux_loss_coeff``) moves every router's gradient, in proportion to its weight.

megatron is imported once, in the fork server the ranks start from (``tests/fixtures/ranks.py``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from fixtures.engine_batches import grpo_loss, rollout_batch, with_old_log_probs
from fixtures.ranks import start_ranks
from fixtures.tiny_models import tiny_moe
from fixtures.tolerances import assert_grads_close, first_step_grads, grad_tolerance

pytestmark = pytest.mark.kernels  # cross-engine tolerances: run under the other ATen kernel set too (Makefile)

TEMPERATURE = 0.7
SHARES = ([0, 2], [1, 3])  # rank 0 keeps 2 left-padding columns, rank 1 none
EXPERTS = 4
AUX = (0.0, 0.01, 0.02)  # the load-balancing loss's weight


def _rolled(routing: torch.Tensor) -> torch.Tensor:
    """Every recorded token's experts moved to the next expert (a top-k set never equal to the old one)."""
    return torch.where(routing >= 0, (routing + 1) % EXPERTS, routing)


def _step(engine, batch) -> dict:
    metrics = engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=1)
    return {"metrics": metrics, "used": engine.last_routing[1],
            "grads": first_step_grads(engine.state_dict()["optimizer"]["exp_avg"])}


def _rank(rank: int, tmp: str) -> None:
    from dockflow.engines.megatron.expert_routing import routers
    from dockflow.engines.megatron.training import MegatronTrainingEngine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    args = dict(ep=2, router_replay=True, lr=1e-3, grad_clip=1e9, temperature=TEMPERATURE)
    engine = MegatronTrainingEngine(tiny_moe(), **args)
    batch = rollout_batch()[SHARES[rank]]
    out = {"own_logp": engine.infer(batch), "attention_mask": batch["attention_mask"]}
    own, used = engine.last_routing
    out["own"], out["own_used"] = own, used
    for name, routing in (("recorded", own), ("rolled", _rolled(own))):
        replayed = batch.clone()
        replayed["routed_experts"] = routing
        out[f"{name}_logp"] = engine.infer(replayed)
        out[f"{name}_own"], out[f"{name}_used"] = engine.last_routing
        out[f"{name}_metrics"] = dict(engine.routing_metrics)
        out[f"{name}_counts"] = engine.routing_counts()
    partial = _rolled(own)
    partial[:, ::2] = -1  # every other token position: not recorded
    replayed = batch.clone()
    replayed["routed_experts"] = partial
    engine.infer(replayed)
    out["partial"], (out["partial_own"], out["partial_used"]) = partial, engine.last_routing
    step = with_old_log_probs(batch, out["rolled_logp"])
    step["routed_experts"] = _rolled(own)
    out["step_batch"] = step
    out["step"] = _step(engine, step)
    out["step_recompute"] = _step(MegatronTrainingEngine(tiny_moe(), gradient_checkpointing=True, **args), step)
    plain = step.exclude("routed_experts")  # the routers' own routing; AdamW's first moments give the gradients
    for coeff in AUX:
        engine = MegatronTrainingEngine(tiny_moe(), ep=2, lr=1e-3, grad_clip=1e9, temperature=TEMPERATURE,
                                        moe_aux_loss_coeff=coeff)
        inputs: list[torch.Tensor] = []  # layer 1's router inputs [s, b, H], one per micro-batch
        routers(engine.model)[1].register_forward_hook(lambda m, args, _, kept=inputs: kept.append(args[0].detach().clone()))
        out[f"aux{coeff}"] = _step(engine, plain)["grads"]
        out[f"aux{coeff}_inputs"] = inputs
    torch.save(out, Path(tmp) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("megatron_moe_replay")
    start_ranks(_rank, (str(tmp),), 2)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _full(ranks: list[dict], key: str) -> torch.Tensor:
    """The ranks' rows of ``key`` back in the batch's order."""
    first = ranks[0][key]
    out = torch.empty((4, *first.shape[1:]), dtype=first.dtype)
    for rank, share in enumerate(SHARES):
        out[share] = ranks[rank][key]
    return out


def _forced_log_probs(model, batch, routed: torch.Tensor | None) -> torch.Tensor:
    """Response log-probs [B, R] of a plain transformers forward over the whole batch, each MoE router forced to
    ``routed``'s experts (-1 rows, or None: its own top-k), gate weights from its own scores at them."""
    for layer_index, layer in enumerate(model.model.layers):
        gate = layer.mlp.gate

        def forward(hidden, gate=gate, layer_index=layer_index):
            logits = F.linear(hidden.reshape(-1, gate.hidden_dim), gate.weight)
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            chosen = probs.topk(gate.top_k, dim=-1).indices
            if routed is not None:
                target = routed[:, :, layer_index].reshape(-1, gate.top_k).long()
                chosen = torch.where((target < 0).any(-1, keepdim=True), chosen, target)
            top = probs.gather(1, chosen)
            if gate.norm_topk_prob:
                top = top / top.sum(-1, keepdim=True)
            return logits, top.to(logits.dtype), chosen

        gate.forward = forward
    ids, mask, width = batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.long().cumsum(-1) - 1).clamp(min=0)).logits
    logp = torch.log_softmax(logits[:, -width - 1:-1].float() / TEMPERATURE, dim=-1)
    return logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1) * batch["response_mask"]


def test_replaying_the_engines_own_routing_changes_nothing(ranks):
    for out in ranks:
        assert torch.equal(out["own"], out["own_used"])
        assert torch.equal(out["recorded_logp"], out["own_logp"])
        assert torch.equal(out["recorded_used"], out["own"])
        assert out["recorded_metrics"] == {"moe/routing_mismatch": 0.0}
        assert out["recorded_counts"][0] == 0
        assert (out["own"] >= 0).sum() > 0


def _mismatch(ranks: list[dict], own: str, recorded: str) -> float:
    """The share of (real token, MoE layer) entries whose top-k set in ``own`` differs from ``recorded``'s."""
    mask = _full(ranks, "attention_mask").bool()
    pairs = [(set(a.tolist()), set(b.tolist())) for a, b, real in zip(
        _full(ranks, own).flatten(0, 2), _full(ranks, recorded).flatten(0, 2),
        mask.unsqueeze(-1).expand(-1, -1, 2).flatten(), strict=True) if real]
    return sum(a != b for a, b in pairs) / len(pairs)


def test_a_replayed_routing_is_the_one_the_routers_use_and_moves_the_log_probs(ranks):
    mask = rollout_batch()["response_mask"]
    for out in ranks:
        out["rolled"] = _rolled(out["own"])
    mismatch = _mismatch(ranks, "rolled_own", "rolled")
    assert mismatch > 0.5
    for rank, out in enumerate(ranks):
        assert torch.equal(out["rolled_used"], out["rolled"])  # exactly the replayed experts
        # the routers' own choice is still measured: layer 0's as before, layer 1's on layer 0's replayed output
        assert torch.equal(out["rolled_own"][:, :, 0], out["own"][:, :, 0])
        assert out["rolled_metrics"]["moe/routing_mismatch"] == pytest.approx(mismatch, abs=1e-12)
        mismatched, recorded = out["rolled_counts"]  # this rank's own share, for the actor to merge
        assert recorded == int(out["attention_mask"].sum()) * 2 and 0 < mismatched <= recorded
        assert float(((out["rolled_logp"] - out["own_logp"]) * mask[SHARES[rank]]).abs().max()) > 1e-3
        unrecorded = (out["partial"] < 0).any(-1, keepdim=True)  # -1: the router's own top-k there
        assert torch.equal(out["partial_used"], torch.where(unrecorded, out["partial_own"], out["partial"]))
        assert unrecorded.any() and (~unrecorded).any()
    assert sum(o["rolled_counts"][0] for o in ranks) / sum(o["rolled_counts"][1] for o in ranks) == mismatch


def test_replayed_log_probs_and_grpo_gradients_equal_a_forced_transformers_forward(ranks):
    batch = rollout_batch()
    mask = batch["response_mask"]
    model = tiny_moe()
    with torch.no_grad():  # the unforced forward is the engine's own routing: the reference is sound
        torch.testing.assert_close(_forced_log_probs(model, batch, None), _full(ranks, "own_logp") * mask,
                                   rtol=0, atol=1e-5)
    rolled = _rolled(_full(ranks, "own"))
    step = torch.cat([ranks[0]["step_batch"], ranks[1]["step_batch"]])[[0, 2, 1, 3]]
    logp = _forced_log_probs(model, step, rolled)
    torch.testing.assert_close(logp, _full(ranks, "rolled_logp") * mask, rtol=0, atol=1e-5)
    grpo_loss()(logp, step, float(mask.sum()))[0].backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(float(g.abs().max()) > 0 for g in grads.values())
    for out in ranks:
        for run in ("step", "step_recompute"):
            assert torch.equal(out[run]["used"], out["rolled_used"]), run  # the update routed as replayed
            assert out[run]["metrics"]["moe/routing_mismatch"] == pytest.approx(_mismatch(ranks, "rolled_own", "rolled_used"), abs=1e-12)
            assert_grads_close(out[run]["grads"], grads)


def test_the_load_balancing_loss_moves_the_routers_gradients_in_proportion_to_its_weight(ranks):
    """With c > 0 the loss reaches the weights through the routers' scores only: every router's gradient moves, by
    twice as much at 2c, layer 1's experts (downstream of every router) keep their gradient bit for bit, and layer 1's
    router moves by c times the gradient of megatron's switch loss, averaged over the micro-batches and DP ranks."""
    for out in ranks:
        base, once, twice = (out[f"aux{c}"] for c in AUX)
        tol = grad_tolerance(base)
        for name in base:
            delta = once[name] - base[name]
            if ".mlp.gate." in name:
                assert float(delta.abs().max()) > 100 * tol, name
            if "layers.1.mlp.experts" in name or name == "model.norm.weight":
                assert torch.equal(once[name], base[name]), name
            torch.testing.assert_close(twice[name] - base[name], 2 * delta, rtol=0, atol=tol, msg=name)
    # Layer 1's router: the change is c times the gradient of megatron's switch loss (E / (K T^2) sum_i n_i sum_t
    # P_ti per micro-batch of T tokens, n_i its tokens routed to i), averaged over each rank's rows and the 2 ranks
    name, coeff = "model.layers.1.mlp.gate.weight", AUX[1]
    weight = tiny_moe().state_dict()[name].requires_grad_()
    total = torch.zeros(())
    for out in ranks:
        for hidden in out[f"aux{coeff}_inputs"]:
            seq, rows, _ = hidden.shape
            probs = torch.softmax(hidden.reshape(seq * rows, -1) @ weight.T, dim=-1)
            counts = torch.zeros(EXPERTS).scatter_add_(0, probs.topk(2).indices.flatten(), torch.ones(2 * seq * rows))
            switch = EXPERTS / (2 * (seq * rows) ** 2) * (probs.sum(0) * counts).sum()
            total = total + switch * rows / (2 * len(SHARES[0]))
    total.backward()
    for out in ranks:
        assert len(out[f"aux{coeff}_inputs"]) == 2  # micro-batches of 1 row
        torch.testing.assert_close(out[f"aux{coeff}"][name] - out["aux0.0"][name], coeff * weight.grad, rtol=0,
                                   atol=grad_tolerance(out["aux0.0"]))


def test_replay_on_a_dense_model_ends_in_one_line():
    from fixtures.tiny_models import tiny_decoder

    from dockflow.engines.megatron.training import MegatronTrainingEngine

    with pytest.raises(ValueError, match=r"^train.router_replay=replay replays a mixture of experts' routing, but "
                                         r"the model \(qwen3\) has a dense MLP"):
        MegatronTrainingEngine(tiny_decoder("qwen3"), lr=1e-3, router_replay=True)
