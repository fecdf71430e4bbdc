"""The dock's protocol on a virtual clock: one GRPO iteration through the centralized buffer or the distributed
dock at any cluster size, with no Ray and no tensors.

It drives the dock's own bookkeeping: ``ControllerState`` decides what every get returns (lowest-first, the
caller's node first, whole groups, DP shares balanced by ``partition.balanced_partitions``), ``ShardMap``
decides which warehouse each row goes to and is read from, and ``dockflow.dock.protocol`` decides whom a
warehouse notifies and which warehouses a get prefers. The message sequence is the clients' (put: rows to
the owning warehouses, each notifies its controllers; get: controller, then the owning warehouses), so a
change to the protocol changes the counts here; ``tests/integration/test_dock_multinode.py`` holds the
counts to a real Ray dock's.

Bytes are counted as the paper counts them (Eqs. 2 and 4): B bytes per element of sample data, and M scalars
of B bytes per sample for each message that names samples (a put, a notification, a get's answer, a read
request). Links follow ``dockflow/dock/netmodel.py``: one per node, transfers into or out of a dock process
that cross nodes hold that process's node link for bytes / bandwidth, serialised; worker endpoints and
node-local transfers are free. Workers compute nothing, so the finish time is the iteration's dispatch time.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dockflow.dock import protocol
from dockflow.dock.controller import ControllerState
from dockflow.dock.netmodel import LinkClock
from dockflow.dock.sharding import ShardMap

GENERATED = ("prompts", "responses")


@dataclass(frozen=True)
class Shape:
    """One configuration of the paper's Table 1: G prompts x N responses, PL, n per-token items, SL, M, B."""

    prompts: int
    responses: int
    prompt_len: int
    items: int
    seq_len: int
    scalars: int
    dtype_bytes: int = 4

    @property
    def samples(self) -> int:
        return self.prompts * self.responses


@dataclass(frozen=True)
class Stage:
    """A worker state that reads from the dock (one controller each): its columns in and out."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    whole_groups: bool = False
    dp_share: bool = False


def grpo_flow(items: int) -> tuple[dict[str, str], list[Stage]]:
    """The GRPO iteration Eq. (2) counts, with ``items`` (n >= 4) per-token items: generation puts prompts and
    responses (and the metadata, the rule reward among it); actor inference and the reference read responses
    and put n - 2 per-token items between them (log-probs, then any further items alternately); the advantage
    state reads those n - 2 and puts advantages; the update reads everything. Per sample that is
    2PL + 3n SL of data in 8 messages: Eq. (2) exactly. Returns (column -> "PL" or "SL", stages)."""
    if items < 4:
        raise ValueError(f"the GRPO flow needs n >= 4 per-token items, got {items}")
    extras = [f"token_item_{k}" for k in range(4, items)]
    actor, reference = ["old_log_prob", *extras[0::2]], ["ref_log_prob", *extras[1::2]]
    widths = {"prompts": "PL", "responses": "SL", **{c: "SL" for c in [*actor, *reference, "advantages"]}}
    stages = [
        Stage("actor_infer", ("responses",), tuple(actor)),
        Stage("reference", ("responses",), tuple(reference)),
        Stage("advantage", (*actor, *reference), ("advantages",), whole_groups=True),
        Stage("update", tuple(widths), (), whole_groups=True, dp_share=True),
    ]
    return widths, stages


@dataclass
class Proc:
    """A dock process (warehouse, controller, central buffer) and what it sent and received."""

    name: str
    node: int
    data_in: int = 0
    data_out: int = 0
    meta_in: int = 0
    meta_out: int = 0
    msgs_in: int = 0
    msgs_out: int = 0
    link_bytes: int = 0  # bytes that crossed nodes (held this process's node link)

    @property
    def bytes(self) -> int:
        return self.data_in + self.data_out + self.meta_in + self.meta_out


@dataclass
class Request:
    """A get waiting in a controller: what it asks and how to answer it."""

    size: int
    columns: tuple[str, ...]
    whole: bool
    prefer: list[int] | None
    dp: tuple[int, int] | None
    node: int
    done: Callable[[np.ndarray], None]
    needed: int = 0  # samples still missing at the last failed take
    seen: int = 0  # the controller's mark counter at that moment


@dataclass
class Keeper:
    """One consumer's bookkeeping (a controller, or the buffer's state for that consumer) and its waiting gets."""

    stage: Stage
    state: ControllerState
    proc: Proc
    waiting: list[Request] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)  # samples marked ready so far, per column


class FlowSim:
    """One GRPO iteration of ``shape`` through ``backend`` ("centralized" or "distributed") on ``nodes`` nodes,
    one warehouse and one DP rank of every worker state per node; links of ``mib_per_s`` MiB/s.

    Rank k generates prompts ``array_split(range(G), nodes)[k]`` and every state's rank k takes as many samples,
    in ``gets_per_rank`` gets. ``shard_block``: samples per block dealt to warehouses (0: one group, the
    DockSpec default; ``G N / nodes``: warehouse k holds what rank k generates, the paper's split along the
    global batch). ``barrier``: each state starts when the one before has finished (deterministic takes;
    ``trace`` then lists every put and take in order, for replaying on a real dock)."""

    def __init__(self, shape: Shape, backend: str, nodes: int, mib_per_s: float, *, gets_per_rank: int = 4,
                 shard_block: int = 0, seed: int = 0, barrier: bool = False) -> None:
        if backend not in ("centralized", "distributed"):
            raise ValueError(f"backend must be centralized or distributed, not {backend!r}")
        self.shape, self.backend, self.nodes, self.gets = shape, backend, nodes, gets_per_rank
        self.widths_kind, self.stages = grpo_flow(shape.items)
        self.widths = {c: shape.prompt_len if k == "PL" else shape.seq_len for c, k in self.widths_kind.items()}
        columns = list(self.widths)
        n, group = shape.samples, shape.responses
        shards = nodes if backend == "distributed" else 1
        self.shard_map = ShardMap(n, group, shards, shard_block)
        owners = self.shard_map.owner(np.arange(n)) if backend == "distributed" else None
        self.links = [LinkClock(mib_per_s) for _ in range(nodes)]
        self.lengths = np.random.default_rng(seed).integers(shape.seq_len // 4, shape.seq_len + 1, n)
        buffer = Proc("buffer", 0)
        self.warehouses = [Proc(f"warehouse/{k}", k) for k in range(shards)] if backend == "distributed" else []
        self.keepers: dict[str, Keeper] = {}
        for k, stage in enumerate(self.stages):
            proc = Proc(f"controller/{stage.name}", k % nodes) if backend == "distributed" else buffer
            state = ControllerState(stage.name, columns, n, group, list(stage.reads), owners)
            self.keepers[stage.name] = Keeper(stage, state, proc, marks=dict.fromkeys(columns, 0))
        self.procs = self.warehouses + [k.proc for k in self.keepers.values()] if backend == "distributed" else [buffer]
        self.interests = {s.name: s.reads for s in self.stages}
        groups = np.array_split(np.arange(shape.prompts), nodes)  # rank k generates these prompts
        self.shares = [np.concatenate([np.arange(g * group, (g + 1) * group) for g in gs]).astype(np.int64)
                       if len(gs) else np.zeros(0, np.int64) for gs in groups]
        self.even = len({len(s) for s in self.shares}) == 1 and len(self.shares[0]) % (gets_per_rank * group) == 0
        self.queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.finish = 0.0
        self.running = 0
        self.barrier = barrier
        self.trace: list[tuple[Any, ...]] = []  # ("put", rank, indices, columns, meta), ("get", stage, rank, size, dp, chosen)

    # ---- the clock ------------------------------------------------------------------------------
    def at(self, time: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self.queue, (time, next(self.seq), fn, args))

    def count(self, proc: Proc, data_in: int = 0, meta_in: int = 0, data_out: int = 0, meta_out: int = 0) -> None:
        """Count a message into (``*_in``) or out of (``*_out``) ``proc``."""
        proc.data_in, proc.meta_in = proc.data_in + data_in, proc.meta_in + meta_in
        proc.data_out, proc.meta_out = proc.data_out + data_out, proc.meta_out + meta_out
        proc.msgs_in += bool(data_in or meta_in)
        proc.msgs_out += bool(data_out or meta_out)

    def hold(self, proc: Proc, other_node: int, nbytes: int) -> float:
        """When a transfer of ``nbytes`` between ``proc`` and ``other_node`` ends: now if node-local, else after
        it held ``proc``'s node link (serialised with that link's other transfers)."""
        if other_node == proc.node:
            return self.now
        proc.link_bytes += nbytes
        return self.links[proc.node].reserve(self.now, nbytes)

    def arrive(self, src_node: int, proc: Proc, data: int, meta: int) -> float:
        self.count(proc, data_in=data, meta_in=meta)
        return self.hold(proc, src_node, data + meta)

    def depart(self, proc: Proc, dst_node: int, data: int, meta: int) -> float:
        self.count(proc, data_out=data, meta_out=meta)
        return self.hold(proc, dst_node, data + meta)

    def data_bytes(self, count: int, columns: Sequence[str]) -> int:
        return count * self.shape.dtype_bytes * sum(self.widths[c] for c in columns)

    def meta_bytes(self, count: int) -> int:
        return count * self.shape.scalars * self.shape.dtype_bytes

    # ---- workers --------------------------------------------------------------------------------
    def _chunks(self, rank: int, pieces: int) -> list[np.ndarray]:
        groups = self.shares[rank].reshape(-1, self.shape.responses)
        if not len(groups):  # more nodes than prompts: this rank has nothing to do
            return []
        return [g.reshape(-1) for g in np.array_split(groups, min(pieces, len(groups)))]

    def _generate(self, rank: int) -> Generator[tuple[Any, ...], Any, None]:
        for idx in self._chunks(rank, self.gets):
            yield ("put", idx, GENERATED, {"response_length": self.lengths[idx]})

    def _consume(self, stage: Stage, rank: int) -> Generator[tuple[Any, ...], Any, None]:
        dp = (rank, self.nodes) if stage.dp_share and self.even and self.nodes > 1 else None
        for chunk in self._chunks(rank, self.gets):
            chosen = yield ("get", stage, len(chunk), dp)
            if stage.writes:
                yield ("put", chosen, stage.writes, None)

    def _step(self, rank: int, worker: Generator[tuple[Any, ...], Any, None], value: Any) -> None:
        try:
            op = worker.send(value)
        except StopIteration:
            self.running -= 1
            self.finish = max(self.finish, self.now)
            return
        def resume(result: Any) -> None:
            self._step(rank, worker, result)
        if op[0] == "put":
            self.trace.append(("put", rank, op[1], op[2], op[3]))
            self._put(rank, op[1], op[2], op[3], resume)
        else:
            self._get(rank, op[1], op[2], op[3], resume)

    def run(self) -> FlowSim:
        """Run the iteration to its end; ``finish`` is then its dispatch time (seconds on the virtual clock)."""
        states = [[(r, self._generate(r)) for r in range(self.nodes)]]
        states += [[(r, self._consume(s, r)) for r in range(self.nodes)] for s in self.stages]
        waves = states if self.barrier else [[w for state in states for w in state]]
        for workers in waves:
            self.running = len(workers)
            for rank, worker in workers:
                self.at(self.now, self._step, rank, worker, None)
            while self.queue:
                self.now, _, fn, args = heapq.heappop(self.queue)
                fn(*args)
            if self.running:
                raise RuntimeError(f"{self.running} workers never finished: the flow deadlocked")
        return self

    # ---- put ------------------------------------------------------------------------------------
    def _put(self, node: int, idx: np.ndarray, columns: Sequence[str], meta: dict[str, np.ndarray] | None,
             done: Callable[[Any], None]) -> None:
        data, scalars = self.data_bytes(len(idx), columns), self.meta_bytes(len(idx))
        if self.backend == "centralized":
            buffer = self.procs[0]
            self.at(self.arrive(node, buffer, data, scalars), self._central_store, idx, columns, meta, done)
            return
        parts = self.shard_map.split(idx)
        pending = [0]
        def acked() -> None:
            pending[0] -= 1
            if pending[0] == 0:
                done(None)
        for shard, pos in parts.items():
            sub = idx[pos]
            part_meta = {k: v[pos] for k, v in meta.items()} if meta else None
            targets = protocol.notify_targets(self.interests, columns, bool(part_meta))
            pending[0] += max(1, len(targets))
            wh = self.warehouses[shard]
            arrival = self.arrive(node, wh, self.data_bytes(len(sub), columns), self.meta_bytes(len(sub)))
            self.at(arrival, self._warehouse_store, wh, sub, columns, part_meta, targets, acked)

    def _warehouse_store(self, wh: Proc, idx: np.ndarray, columns: Sequence[str], meta: dict[str, np.ndarray] | None,
                         targets: list[str], acked: Callable[[], None]) -> None:
        if not targets:
            acked()
        for consumer in targets:
            keeper = self.keepers[consumer]
            sent = self.depart(wh, keeper.proc.node, 0, self.meta_bytes(len(idx)))
            self.at(sent, self._controller_receive, keeper, wh.node, idx, columns, meta, acked)

    def _controller_receive(self, keeper: Keeper, src: int, idx: np.ndarray, columns: Sequence[str],
                            meta: dict[str, np.ndarray] | None, acked: Callable[[], None]) -> None:
        arrival = self.arrive(src, keeper.proc, 0, self.meta_bytes(len(idx)))
        self.at(arrival, self._mark, [keeper], idx, columns, meta, acked)

    def _central_store(self, idx: np.ndarray, columns: Sequence[str], meta: dict[str, np.ndarray] | None,
                       done: Callable[[Any], None]) -> None:
        self._mark(list(self.keepers.values()), idx, columns, meta, lambda: done(None))

    def _mark(self, keepers: list[Keeper], idx: np.ndarray, columns: Sequence[str],
              meta: dict[str, np.ndarray] | None, acked: Callable[[], None]) -> None:
        for keeper in keepers:
            keeper.state.mark_ready(idx, list(columns), meta)
            for column in columns:
                keeper.marks[column] += len(idx)
        acked()
        for keeper in keepers:
            self._serve(keeper)

    # ---- get ------------------------------------------------------------------------------------
    def _get(self, node: int, stage: Stage, size: int, dp: tuple[int, int] | None, done: Callable[[Any], None]) -> None:
        keeper = self.keepers[stage.name]
        prefer = protocol.local_shards(list(range(self.nodes)), node) if self.backend == "distributed" else None
        keeper.state.validate(size, stage.reads, stage.whole_groups, None, dp)
        keeper.waiting.append(Request(size, stage.reads, stage.whole_groups, prefer, dp, node, done))
        self._serve(keeper)

    def _serve(self, keeper: Keeper) -> None:
        """Retry waiting gets in arrival order, as the controller's long-poll does on each notification. Skipped,
        with the same outcome: a get that cannot have become satisfiable since it last failed (fewer samples were
        marked ready for its columns since then than it lacked; whole groups count a mark as a group), and one
        asking what a get that just failed in this pass asked (the same samples qualify)."""
        state, still = keeper.state, []
        failed: dict[tuple[Any, ...], tuple[int, int]] = {}
        marked: dict[tuple[str, ...], int] = {}
        for request in keeper.waiting:
            need = state.samples_needed(request.size, None, request.dp)
            split_off = request.dp is not None and need == request.size  # its DP share is waiting for it
            if not split_off:
                key = (need, request.columns, request.whole)
                if key in failed:
                    request.needed, request.seen = failed[key]
                    still.append(request)
                    continue
                if request.columns not in marked:
                    marked[request.columns] = sum(keeper.marks[c] for c in request.columns)
                gain = (marked[request.columns] - request.seen) * (self.shape.responses if request.whole else 1)
                if request.needed and gain < request.needed:
                    still.append(request)
                    continue
            chosen = state.take(request.size, list(request.columns), request.whole, None, request.prefer, request.dp)
            if chosen is None:
                request.needed = need - state.available(request.columns, request.whole)
                request.seen = marked[request.columns]
                failed[key] = (request.needed, request.seen)
                still.append(request)
                continue
            self.trace.append(("get", keeper.stage.name, request.node, request.size, request.dp, chosen))
            self._answer(keeper, request, chosen)
        keeper.waiting = still

    def _answer(self, keeper: Keeper, request: Request, chosen: np.ndarray) -> None:
        if self.backend == "centralized":
            data = self.data_bytes(len(chosen), request.columns)
            self.at(self.depart(keeper.proc, request.node, data, self.meta_bytes(len(chosen))), request.done, chosen)
            return
        sent = self.depart(keeper.proc, request.node, 0, self.meta_bytes(len(chosen)))
        self.at(sent, self._read, request, chosen)

    def _read(self, request: Request, chosen: np.ndarray) -> None:
        """Read the rows from their warehouses in parallel: each gets the indices and sends the rows back, both
        in one hold of its link (as ``NodeWarehouse.read`` does under the network model)."""
        ends = []
        for shard, pos in self.shard_map.split(chosen).items():
            wh = self.warehouses[shard]
            meta, data = self.meta_bytes(len(pos)), self.data_bytes(len(pos), request.columns)
            self.count(wh, meta_in=meta, data_out=data)
            ends.append(self.hold(wh, request.node, meta + data))
        self.at(max(ends), request.done, chosen)
