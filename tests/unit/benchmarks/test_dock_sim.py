"""The protocol simulator (benchmarks/dock_sim_engine.py, dock_sim.py) holds to the paper's Eqs. (2) and (4) on
small cases, reproduces Table 1's printed TCV, and follows the dock's protocol module."""

import pytest

from benchmarks import dock_sim
from benchmarks.dock_sim_engine import FlowSim, Shape, grpo_flow
from benchmarks.dock_sweep import linearity
from dockflow.dock import protocol

SMALL = [Shape(8, 4, 8, 4, 16, 3), Shape(12, 4, 6, 5, 10, 5), Shape(16, 2, 4, 8, 32, 4)]


@pytest.mark.parametrize("shape", SMALL)
@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_centralized_buffer_moves_exactly_eq2(shape, nodes):
    sim = FlowSim(shape, "centralized", nodes, 100.0).run()
    (buffer,) = sim.procs
    assert buffer.bytes == dock_sim.tcv_eq2(shape)
    # Every transfer from another node held the buffer's link: (S - 1) / S of the bytes, at 100 MiB/s.
    crossing = dock_sim.tcv_eq2(shape) * (nodes - 1) / nodes
    assert sim.links[0].busy_s == pytest.approx(crossing / (100 * 2**20))
    assert sim.finish >= sim.links[0].busy_s - 1e-12


@pytest.mark.parametrize("shape", SMALL)
@pytest.mark.parametrize("nodes", [2, 4])
def test_each_warehouse_moves_tcv_over_s_plus_metadata_within_eq4(shape, nodes):
    sim = FlowSim(shape, "distributed", nodes, 100.0, shard_block=shape.samples // nodes).run()
    consumers = len(grpo_flow(shape.items)[1])
    data = dock_sim.tcv_eq2(shape) - 8 * shape.scalars * shape.dtype_bytes * shape.samples  # 2PL + 3n SL
    for warehouse in sim.warehouses:
        assert warehouse.data_in + warehouse.data_out == data // nodes  # exactly 1/S of the data
        assert data // nodes < warehouse.bytes <= dock_sim.tcv_eq4(shape, consumers, nodes)
    controllers = [p for p in sim.procs if p.name.startswith("controller/")]
    assert len(controllers) == consumers and all(c.data_in == c.data_out == 0 for c in controllers)


def test_table1_tcv_matches_the_printed_values():
    for shape, printed in dock_sim.TABLE1:
        gib = dock_sim.tcv_eq2(shape) / 2**30
        assert dock_sim.within_rounding(gib, *printed[0])
        assert dock_sim.within_rounding(gib * 1024 / 100, *printed[1])  # T100: 100 MB/s, MB = MiB
        assert dock_sim.within_rounding(gib, *printed[2])  # T1K: 1 GB/s
    assert not dock_sim.within_rounding(1.0, 0.96, 0.01)


def test_a_protocol_change_shows_up_in_the_simulator(monkeypatch):
    shape = SMALL[0]
    before = FlowSim(shape, "distributed", 2, 100.0).run()
    monkeypatch.setattr(protocol, "notify_targets", lambda interests, columns, has_meta: list(interests))
    after = FlowSim(shape, "distributed", 2, 100.0).run()  # every put now notifies every controller
    notes = [sum(p.msgs_in for p in s.procs if p.name.startswith("controller/")) for s in (before, after)]
    assert notes[1] > notes[0]


def test_every_get_returns_its_samples_once_and_the_flow_finishes():
    shape = Shape(24, 4, 8, 5, 16, 3)
    sim = FlowSim(shape, "distributed", 3, 100.0, barrier=True).run()
    for stage in grpo_flow(shape.items)[1]:
        taken = [i for op in sim.trace if op[0] == "get" and op[1] == stage.name for i in op[5].tolist()]
        assert sorted(taken) == list(range(shape.samples))  # no sample lost or taken twice
    assert sim.finish > 0


def test_quick_run_writes_records(tmp_path, capsys):
    import json

    out = tmp_path / "sim.json"
    assert dock_sim.main(["--out", str(out), "--rows", "1", "--nodes", "16", "--skip-linearity"]) == 0
    records = json.loads(out.read_text())["results"]
    assert {r["backend"] for r in records} == {"centralized", "distributed"}
    assert all(r["tcv_matches_paper"] for r in records)
    assert "Eq2 GB" in capsys.readouterr().out


def test_sweep_linearity_is_per_node_throughput_relative_to_the_smallest_cluster():
    records = [{"backend": "dock", "nodes": n, "samples": 64 * n, "wall_s": w} for n, w in [(1, 1.0), (2, 1.25), (4, 2.0)]]
    assert [r["linearity"] for r in linearity(records)] == [1.0, 0.8, 0.5]
