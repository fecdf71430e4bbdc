"""Routing replay's settings (``dockflow.config.router_replay``): the run plan carries ``routed_experts`` from generation
to the actor's states (and the reference's with replay) for an MoE policy only; replay that cannot run is one line at
start; the dock stores the per-sample [T, L, K] int16 column bit-exactly; generation's dock columns follow the plan."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from dockflow.config import Config, ConfigError, load_config
from dockflow.dock.sharding import ShardMap
from dockflow.dock.warehouse import WarehouseStore
from dockflow.dock.wire import from_wire, to_wire, wire_dtypes
from dockflow.rollout.plain import dock_columns
from dockflow.workers.resources import build_plan
from dockflow.workers.run_dock import COLUMNS

MOE = ["model.tiny.architecture=qwen3_moe"]


def _plan(*overrides: str):
    return build_plan(load_config("configs/grpo_arith.yaml", [*overrides]))


def test_the_plan_carries_routing_for_an_moe_policy_only():
    dense = _plan("algorithm.kl_coef=0.01")
    assert not dense.records_routing and "routed_experts" not in dense.role("actor").writes
    off = _plan(*MOE, "algorithm.kl_coef=0.01")
    assert off.records_routing and "routed_experts" in off.role("actor").writes
    consumers = off.consumers()
    assert "routed_experts" in consumers["actor_infer"]  # the mismatch metric, replay or not
    assert "routed_experts" not in consumers["actor_update"] and "routed_experts" not in consumers["ref_infer"]
    on = _plan(*MOE, "algorithm.kl_coef=0.01", "train.router_replay=replay").consumers()
    assert all("routed_experts" in on[state] for state in ("actor_infer", "actor_update", "ref_infer"))
    rollout = _plan(*MOE, "train.old_log_prob=rollout").consumers()  # no actor_infer: the update measures
    assert "actor_infer" not in rollout and "routed_experts" in rollout["actor_update"]
    vllm = _plan(*MOE, "engine.backend=vllm")  # vLLM's CPU build cannot record: no column, no metric
    assert not vllm.records_routing


@pytest.mark.parametrize(("overrides", "message"), [
    ([], "model.tiny.architecture=qwen2 is dense"),
    ([*MOE, "engine.backend=vllm"], "vLLM's CPU build cannot return routed experts"),
    ([*MOE, "engine.backend=cost_model"], "engine.backend=cost_model"),
    ([*MOE, "placement.mode=disaggregated", "rollout.partial.token_budget=4"], "rollout.partial.token_budget"),
])
def test_replay_that_cannot_run_is_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config("configs/grpo_arith.yaml", [*overrides, "train.router_replay=replay"])
    assert "\n" not in str(err.value) and "train.router_replay=replay with" in str(err.value)


def test_a_bare_yaml_off_is_off():
    assert load_config(None, ["train.router_replay=off"]).train.router_replay == "off"
    assert Config(train={"router_replay": False}).train.router_replay == "off"


def test_the_dock_holds_routing_bit_exactly():
    store = WarehouseStore(wire_dtypes({"routed_experts": COLUMNS["routed_experts"]}), ShardMap(8, 2, 1))
    routed = torch.randint(-1, 128, (3, 11, 4, 2), dtype=torch.int16)
    store.write(torch.tensor([0, 3, 5]).numpy(), {"routed_experts": to_wire(routed)})
    out = from_wire(store.read(torch.tensor([5, 0]).numpy(), ["routed_experts"])["routed_experts"], torch.int16)
    assert torch.equal(out, routed[[2, 0]])


def test_generation_puts_routing_into_the_dock_where_planned():
    out = TensorDict({"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 5, dtype=torch.long),
                      "responses": torch.ones(2, 2, dtype=torch.long), "response_mask": torch.ones(2, 2, dtype=torch.long),
                      "rollout_log_prob": torch.zeros(2, 2), "routed_experts": torch.zeros(2, 5, 4, 2, dtype=torch.int16)},
                     batch_size=[2])
    assert "routed_experts" in dock_columns(load_config("configs/grpo_arith.yaml", MOE), out).keys()
    assert "routed_experts" not in dock_columns(load_config("configs/grpo_arith.yaml"), out).keys()
