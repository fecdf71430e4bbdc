"""The distributed dock on a simulated 3-node Ray cluster: warehouse i on node i, each controller next to its
consumer, and sample data moving between workers and warehouses without ever passing through the driver."""

from __future__ import annotations

import os
import sys

import pytest
import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tensordict import TensorDict

from dockflow.dock import DockSpec, create_dock
from dockflow.dock.rpc import peer_id

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

NODES = 3
CAPACITY, GROUP, SL = 48, 4, 16
COLUMNS = {"responses": torch.long, "rewards": torch.float32}


@pytest.fixture(scope="module")
def nodes():
    """Node ids in the order the nodes were added (node i carries resource ``dock_node_i``)."""
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "resources": {"dock_node_0": 1}, "include_dashboard": False})
    for i in range(1, NODES):
        cluster.add_node(num_cpus=0, resources={f"dock_node_{i}": 1})
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address=cluster.address, namespace="dock-multinode-test")
    by_resource = {r: n["NodeID"] for n in ray.nodes() if n["Alive"] for r in n["Resources"] if r.startswith("dock_node_")}
    yield [by_resource[f"dock_node_{i}"] for i in range(NODES)]
    ray.shutdown()
    cluster.shutdown()


@ray.remote(num_cpus=0, max_concurrency=4)
class Worker:
    """A worker on a given node: registers consumers, puts and gets through a (pickled) dock client."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def worker_id(self) -> str:
        return peer_id()

    def register(self, dock, consumer, columns):
        dock.register_consumer(consumer, columns)

    def produce(self, dock, indices, column):
        n = len(indices)
        data = torch.arange(SL) + torch.tensor(indices).unsqueeze(1) * 1000
        value = data if column == "responses" else data.sum(dim=1).to(torch.float32)
        dock.put(indices, TensorDict({column: value}, batch_size=[n]))

    def take_indices(self, dock, consumer, batch_size):
        return dock.get(consumer, batch_size, timeout_s=60).indices

    def consume(self, dock, consumer, batch_size, rounds):
        checks = []
        for _ in range(rounds):
            batch = dock.get(consumer, batch_size, timeout_s=60)
            expected = torch.arange(SL) + torch.tensor(batch.indices).unsqueeze(1) * 1000
            if "responses" in batch.data.keys():
                checks.append(bool(torch.equal(batch.data["responses"], expected)))
        return checks


def on(node_id: str) -> Worker:
    return Worker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


@pytest.fixture(scope="module")
def workers(nodes):
    """One worker per node, shared by the tests (each takes seconds to start)."""
    return [on(n) for n in nodes]


def test_warehouse_i_on_node_i(nodes):
    order = list(reversed(nodes))
    dock = create_dock(DockSpec(columns=COLUMNS, capacity=CAPACITY, group_size=GROUP, warehouse_nodes=order,
                                name="placed"))
    try:
        assert [w["node_id"] for w in dock.stats()["warehouses"]] == order
    finally:
        dock.shutdown()
    default = create_dock(DockSpec(columns=COLUMNS, capacity=CAPACITY, group_size=GROUP, name="default"))
    try:
        placed = [w["node_id"] for w in default.stats()["warehouses"]]
        assert sorted(placed) == sorted(nodes) and placed[0] == nodes[0]  # one per node, head first
    finally:
        default.shutdown()


def test_flow_places_controllers_by_consumers_and_bypasses_driver(nodes, workers):
    dock = create_dock(DockSpec(columns=COLUMNS, capacity=CAPACITY, group_size=GROUP, warehouse_nodes=nodes,
                                name="flow", get_timeout_s=60))
    try:
        producer, scorer, trainer = workers
        # The scorer registers itself (controller lands on its node); the trainer's is placed by node id.
        ray.get(scorer.register.remote(dock, "reward", ["responses"]))
        dock.register_consumer("update", ["responses", "rewards"], node_id=nodes[2])
        stats = dock.stats()
        assert stats["controllers"]["reward"]["node_id"] == nodes[1]
        assert stats["controllers"]["update"]["node_id"] == nodes[2]

        scoring = scorer.consume.remote(dock, "reward", 8, CAPACITY // 8)
        training = trainer.consume.remote(dock, "update", 12, CAPACITY // 12)
        ray.get([producer.produce.remote(dock, list(range(s, s + 8)), "responses") for s in range(0, CAPACITY, 8)])
        ray.get(scorer.produce.remote(dock, list(range(CAPACITY)), "rewards"))
        assert all(ray.get(scoring, timeout=120)) and all(ray.get(training, timeout=120))

        stats = dock.stats()
        workers = set(ray.get([w.worker_id.remote() for w in (producer, scorer, trainer)]))
        driver = peer_id()
        moved = 0
        for warehouse in stats["warehouses"]:
            assert driver not in warehouse["bytes_by_peer"]
            assert set(warehouse["bytes_by_peer"]) <= workers
            moved += warehouse["bytes_in"] + warehouse["bytes_out"]
        for controller in stats["controllers"].values():
            assert controller["bytes_in"] == controller["bytes_out"] == 0  # metadata only
            assert controller["consumed"] == CAPACITY
        responses = CAPACITY * SL * 8
        assert moved == responses * 3 + CAPACITY * 4 * 2  # put + 2 reads of responses, put + read of rewards
        # Each warehouse carries its 1/S share (whole groups dealt round-robin), plus metadata.
        data_share = [w["bytes_in"] + w["bytes_out"] for w in stats["warehouses"]]
        assert max(data_share) == moved // NODES
        assert stats["busiest_bytes"] < moved // NODES * 1.5
    finally:
        dock.shutdown()


def test_get_prefers_the_warehouse_on_its_node_then_takes_from_the_others(nodes, workers):
    block = CAPACITY // NODES  # warehouse i owns [i*block, (i+1)*block)
    dock = create_dock(DockSpec(columns=COLUMNS, capacity=CAPACITY, group_size=GROUP, warehouse_nodes=nodes,
                                name="local", get_timeout_s=60, shard_block=block))
    try:
        dock.register_consumer("reward", ["responses"], node_id=nodes[0])
        reader = workers[2]
        ray.get(workers[0].produce.remote(dock, list(range(CAPACITY)), "responses"))
        first = ray.get(reader.take_indices.remote(dock, "reward", block))
        assert first == list(range(2 * block, 3 * block))  # node 2's shard, though lower indices are ready
        rest = ray.get(reader.take_indices.remote(dock, "reward", block))
        assert rest == list(range(block))  # its own shard is used up: it takes from the others, lowest first
    finally:
        dock.shutdown()
