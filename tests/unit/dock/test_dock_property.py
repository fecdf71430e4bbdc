"""Property: random interleavings of puts and gets by several consumers, over sharded warehouse stores and
per-consumer controller states (the distributed dock without Ray), never lose, duplicate or mix up a sample."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dockflow.dock.controller import ControllerState
from dockflow.dock.sharding import ShardMap
from dockflow.dock.warehouse import WarehouseStore
from dockflow.dock.wire import from_wire, to_wire, wire_dtypes

CAPACITY, GROUP = 24, 4
COLUMNS = {"a": torch.long, "b": torch.float32}
WIRE = wire_dtypes(COLUMNS)
CONSUMERS = {"ca": ["a"], "cb": ["b"], "cab": ["a", "b"]}


def payload(indices: np.ndarray, column: str) -> torch.Tensor:
    """Data that names its own sample and column, so any mix-up shows."""
    base = torch.from_numpy(indices).unsqueeze(1) * 10 + (1 if column == "a" else 2)
    return base.repeat(1, 3).to(COLUMNS[column])


class ModelDock:
    def __init__(self, shards: int) -> None:
        self.map = ShardMap(CAPACITY, GROUP, shards)
        self.stores = [WarehouseStore(WIRE, self.map, s) for s in range(shards)]
        self.controllers = {c: ControllerState(c, list(COLUMNS), CAPACITY, GROUP, cols) for c, cols in CONSUMERS.items()}

    def put(self, indices: np.ndarray, column: str) -> None:
        for shard, pos in self.map.split(indices).items():
            self.stores[shard].write(indices[pos], {column: to_wire(payload(indices[pos], column))})
            for controller in self.controllers.values():
                controller.mark_ready(indices[pos], [column])

    def get(self, consumer: str, size: int, whole: bool):
        controller = self.controllers[consumer]
        chosen = controller.take(size, controller.columns, whole)
        if chosen is None:
            return None
        rows = {}
        for shard, pos in self.map.split(chosen).items():
            part = self.stores[shard].read(chosen[pos], controller.columns)
            for column, tensor in part.items():
                rows.setdefault(column, torch.empty((len(chosen), 3), dtype=COLUMNS[column]))[torch.from_numpy(pos)] = from_wire(tensor, COLUMNS[column])
        return chosen, rows


put_op = st.tuples(st.just("put"), st.lists(st.integers(0, CAPACITY - 1), min_size=1, max_size=10, unique=True), st.sampled_from(list(COLUMNS)))
get_op = st.tuples(st.just("get"), st.sampled_from(list(CONSUMERS)), st.sampled_from([1, 2, 4, 8]), st.booleans())


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.lists(st.one_of(put_op, get_op), max_size=40))
def test_interleavings_never_lose_duplicate_or_mix_up(shards, ops):
    dock = ModelDock(shards)
    seen = {c: [] for c in CONSUMERS}
    written = {c: set() for c in COLUMNS}

    def check(consumer, result):
        chosen, rows = result
        assert chosen.tolist() == sorted(chosen.tolist())
        for column in CONSUMERS[consumer]:
            assert all(i in written[column] for i in chosen.tolist())
            assert torch.equal(rows[column], payload(chosen, column))
        seen[consumer].extend(chosen.tolist())

    for op in ops:
        if op[0] == "put":
            indices = np.array(op[1], dtype=np.int64)
            dock.put(indices, op[2])
            written[op[2]].update(op[1])
        else:
            _, consumer, size, whole = op
            result = dock.get(consumer, size * (GROUP if whole else 1), whole)
            if result is not None:
                check(consumer, result)
            else:  # refused only when there really are too few ready samples
                ready = set.intersection(*(written[c] for c in CONSUMERS[consumer])) - set(seen[consumer])
                assert len(ready) < size * (GROUP if whole else 1) or whole
    # Fill everything, then drain: every consumer ends with every sample exactly once.
    for column in COLUMNS:
        missing = np.array(sorted(set(range(CAPACITY)) - written[column]), dtype=np.int64)
        if len(missing):
            dock.put(missing, column)
            written[column].update(missing.tolist())
    for consumer in CONSUMERS:
        remaining = CAPACITY - len(seen[consumer])
        if remaining:
            check(consumer, dock.get(consumer, remaining, False))
        assert sorted(seen[consumer]) == list(range(CAPACITY))
