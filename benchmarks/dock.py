"""Sample flow of one GRPO iteration through three backends, side by side on a simulated 4-node Ray cluster:
(a) the centralized buffer, (b) the distributed transfer dock, (c) TransferQueue (PyPI, SimpleStorage).

One worker actor per node hosts that node's DP rank of every stage (a thread each): generate puts prompts
and responses; old_logp, ref, reward and advantage read their inputs and put their outputs; update reads
everything. Stages stream: each starts at once and waits only for the samples it needs.

Reported per backend and size: wall seconds of the flow, bytes through the busiest dock process, p50/p99
get latency as consumers see it, and the paper's analytical volumes, Eq. (2) (centralized) and Eq. (4)
(per warehouse). Usage: ``python -m benchmarks.dock --out dock.json [--quick]``.

``--nic-mbps 100`` turns on the paper's bandwidth model (``dockflow/dock/netmodel.py``): every simulated node
gets one modelled link of 100 MiB/s, and each transfer into or out of a dock process that crosses nodes holds
that process's node link for bytes / bandwidth, serialised, waiting without CPU. It is a model of the
network applied alike to both DockFlow backends (the centralized buffer and the distributed dock);
TransferQueue is not modelled, so it is left out of modelled runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from benchmarks.results_file import write_results  # noqa: E402
from dockflow.dock.request import DockRequest  # noqa: E402

NODES = 4  # the simulated cluster; --nodes changes it (the smoke test uses 2)
GROUP = 16  # N responses per prompt
BYTES = 4  # B: int32 / float32
META_SCALARS = 4  # M: prompt id, response length, policy version, age
SEQ_LEN_ITEMS = 4  # n: responses, old_log_prob, ref_log_prob, advantages
# consumer, columns it reads, columns it writes, whole GRPO groups
STAGES = [
    ("old_logp", ["prompts", "responses"], ["old_log_prob"], False),
    ("ref", ["prompts", "responses"], ["ref_log_prob"], False),
    ("reward", ["responses"], ["rewards"], False),
    ("advantage", ["rewards"], ["advantages"], True),
    ("update", ["prompts", "responses", "old_log_prob", "ref_log_prob", "advantages"], [], False),
]
DTYPES = {
    "prompts": torch.int32, "responses": torch.int32, "old_log_prob": torch.float32,
    "ref_log_prob": torch.float32, "rewards": torch.float32, "advantages": torch.float32,
}
FULL_SIZES = [(256, 256), (1024, 1024), (4096, 2048)]  # (samples G x N, response tokens SL); PL = SL / 2
# Under the bandwidth model: fewer, longer samples (a run takes minutes here, the links carry most of the time).
MODEL_SIZES = [(1024, 8192), (1024, 32768), (1024, 65536)]
QUICK_SIZES = [(64, 64)]
MODELLED_BACKENDS = ("centralized", "dock")
MODEL_STORE_BYTES = 2**30  # object store per simulated node under the bandwidth model


def shapes(seq: int) -> dict[str, tuple[int, ...]]:
    per_token = {"prompts": (seq // 2,), "rewards": ()}
    return {c: per_token.get(c, (seq,)) for c in DTYPES}


def micro_batch(samples: int) -> int:
    return max(GROUP, min(64, samples // 16))


def tcv_eq2(samples: int, seq: int) -> int:
    """Eq. (2): bytes through the centralized buffer, G*N*B*(2PL + 3n*SL + 8M)."""
    return samples * BYTES * (2 * (seq // 2) + 3 * SEQ_LEN_ITEMS * seq + 8 * META_SCALARS)


def tcv_eq4(samples: int, seq: int, consumers: int, warehouses: int) -> int:
    """Eq. (4): bytes through each warehouse, G*N*B*(2PL + 3n*SL + 8(C+1)M)/S."""
    body = 2 * (seq // 2) + 3 * SEQ_LEN_ITEMS * seq + 8 * (consumers + 1) * META_SCALARS
    return samples * BYTES * body // warehouses


@ray.remote(num_cpus=0, max_concurrency=16)
class NodeWorker:
    """The workers of one node: one thread per stage role, all through the same backend client."""

    def setup(self, backend: str, dock: Any, samples: int, seq: int, num_nodes: int, micro: int) -> None:
        self.backend, self.dock, self.samples, self.seq = backend, dock, samples, seq
        self.num_nodes = num_nodes
        self.mb = micro
        self.rows = {c: torch.ones((self.mb, *s), dtype=DTYPES[c]) for c, s in shapes(seq).items()}
        self.unit_bytes: dict[int, int] = defaultdict(int)  # TransferQueue: bytes per storage unit
        if backend == "transferqueue":
            import transfer_queue as tq

            tq.init()
            self.tq = tq.get_client()
            self.units = num_nodes
            self.partition = f"flow-{samples}-{seq}"

    # -- one backend behind three calls ------------------------------------------------------------
    def _row_bytes(self, columns: list[str]) -> int:
        return sum(self.rows[c][0].numel() * BYTES for c in columns)

    def _account_tq(self, global_indexes: list[int], columns: list[str]) -> None:
        per_row = self._row_bytes(columns)
        for index in global_indexes:
            self.unit_bytes[index % self.units] += per_row

    def put_new(self, start: int, columns: list[str]) -> None:
        from tensordict import TensorDict

        data = TensorDict({c: self.rows[c] for c in columns}, batch_size=[self.mb])
        if self.backend == "transferqueue":
            meta = self.tq.put(data, partition_id=self.partition)
            self._account_tq(list(meta.global_indexes), columns)
        else:
            lengths = torch.full((self.mb,), self.seq)
            self.dock.put(range(start, start + self.mb), data, meta={"response_length": lengths})

    def get(self, consumer: str, columns: list[str], whole: bool) -> tuple[Any, float]:
        started = time.perf_counter()
        if self.backend == "transferqueue":
            while True:  # TransferQueue's streaming mode: the controller answers empty until enough is ready
                meta = self.tq.get_meta(data_fields=columns, batch_size=self.mb, partition_id=self.partition,
                                        task_name=consumer)
                if len(meta) == self.mb:
                    break
                time.sleep(0.002)
            self.tq.get_data(meta)
            self._account_tq(list(meta.global_indexes), columns)
            handle = meta
        else:
            handle = self.dock.get(DockRequest(consumer, self.mb, tuple(columns), whole_groups=whole, timeout_s=600)).indices
        return handle, time.perf_counter() - started

    def put_derived(self, handle: Any, columns: list[str]) -> None:
        from tensordict import TensorDict

        data = TensorDict({c: self.rows[c] for c in columns}, batch_size=[self.mb])
        if self.backend == "transferqueue":
            self.tq.put(data, metadata=handle)
            self._account_tq(list(handle.global_indexes), columns)
        else:
            self.dock.put(handle, data)

    # -- roles -------------------------------------------------------------------------------------
    def generate(self, rank: int) -> dict[str, Any]:
        share = self.samples // self.num_nodes
        for start in range(rank * share, (rank + 1) * share, self.mb):
            self.put_new(start, ["prompts", "responses"])
        return {"gets": []}

    def consume(self, stage: int) -> dict[str, Any]:
        consumer, reads, writes, whole = STAGES[stage]
        latencies = []
        for _ in range(self.samples // self.num_nodes // self.mb):
            handle, latency = self.get(consumer, reads, whole)
            latencies.append(latency)
            if writes:
                self.put_derived(handle, writes)
        return {"gets": latencies}

    def tq_unit_bytes(self) -> dict[int, int]:
        return dict(self.unit_bytes)

    def teardown(self) -> None:
        if self.backend == "transferqueue":
            self.tq.clear_partition(self.partition)
        self.dock = None


def start_cluster(num_nodes: int, store_bytes: int | None = None) -> tuple[Cluster, list[str]]:
    """A simulated cluster of ``num_nodes`` nodes; ``store_bytes``: each node's object store (None: Ray's default)."""
    store = {"object_store_memory": store_bytes} if store_bytes else {}
    head = {"num_cpus": 4, "resources": {"bench_node_0": 1}, "include_dashboard": False, **store}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for i in range(1, num_nodes):
        cluster.add_node(num_cpus=4, resources={f"bench_node_{i}": 1}, **store)  # logical CPUs for TransferQueue
    ray.init(address=cluster.address, namespace="dock-benchmark", log_to_driver=False)
    by_resource = {r: n["NodeID"] for n in ray.nodes() if n["Alive"] for r in n["Resources"] if r.startswith("bench_node_")}
    return cluster, [by_resource[f"bench_node_{i}"] for i in range(num_nodes)]


def ray_cpu_seconds() -> dict[int, float]:
    """CPU seconds so far of every process of the simulated cluster (raylets, GCS, actors: this driver's process
    tree) and the driver itself; other users' processes (another Ray cluster on the machine) are not counted.

    All simulated nodes share this machine's cores, so when the flow is CPU-bound its wall time is about
    this total divided by the core count, whatever the design spreads over nodes."""
    me = psutil.Process()
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
        except psutil.Error:
            pass
    return out


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has been busy (every process, ours and others')."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def busiest_link_s(stats: dict[str, Any]) -> float:
    """Seconds of modelled link time on the busiest node (its dock processes share one link); 0 when unmodelled."""
    processes = stats.get("warehouses", []) + list(stats["controllers"].values()) + [stats.get("buffer", {})]
    per_node: dict[str, float] = defaultdict(float)
    for p in processes:
        if "link_busy_s" in p:
            per_node[p["node_id"]] += p["link_busy_s"]
    return max(per_node.values(), default=0.0)


def run_flow(backend: str, samples: int, seq: int, nodes: list[str], workers: list[Any],
             nic_mbps: float | None = None, micro: int | None = None) -> dict[str, Any]:
    """One GRPO iteration's flow through ``backend``; ``micro``: samples per get and put (default: by size)."""
    from dockflow.dock import DockSpec, create_dock
    from dockflow.dock.netmodel import LinkSpec

    dock = None
    if backend in MODELLED_BACKENDS:
        spec = DockSpec(columns=DTYPES, capacity=samples, group_size=GROUP, warehouse_nodes=nodes,
                        backend="centralized" if backend == "centralized" else "distributed",
                        name=f"bench-{backend}-{samples}-{seq}", get_timeout_s=600,
                        shard_block=samples // len(nodes))  # warehouse k holds the share node k generates
        dock = create_dock(spec, link=LinkSpec(nic_mbps) if nic_mbps is not None else None)
        for k, (consumer, reads, _, _) in enumerate(STAGES):
            dock.register_consumer(consumer, reads, node_id=nodes[k % len(nodes)])  # next to one of its ranks
    mb = micro or micro_batch(samples)
    ray.get([w.setup.remote(backend, dock, samples, seq, len(nodes), mb) for w in workers])
    cpu_before, busy_before = ray_cpu_seconds(), busy_cpu_seconds()
    started = time.perf_counter()
    calls = [w.generate.remote(rank) for rank, w in enumerate(workers)]
    calls += [w.consume.remote(stage) for w in workers for stage in range(len(STAGES))]
    results = ray.get(calls, timeout=900)
    wall = time.perf_counter() - started
    cpu = sum(c - cpu_before.get(pid, 0.0) for pid, c in ray_cpu_seconds().items())
    foreign = max(0.0, busy_cpu_seconds() - busy_before - cpu) / wall  # other processes' busy cores meanwhile
    gets = np.array([t for r in results for t in r["gets"]])
    if backend == "transferqueue":
        per_unit: dict[int, int] = defaultdict(int)
        for unit_bytes in ray.get([w.tq_unit_bytes.remote() for w in workers]):
            for unit, n in unit_bytes.items():
                per_unit[unit] += n
        busiest = max(per_unit.values())
        link_s = 0.0
    else:
        stats = dock.stats()
        busiest, link_s = stats["busiest_bytes"], busiest_link_s(stats)
    ray.get([w.teardown.remote() for w in workers])
    if dock is not None:
        dock.shutdown()
    return {
        "backend": backend,
        "samples": samples,
        "seq_tokens": seq,
        "prompt_tokens": seq // 2,
        "micro_batch": mb,
        "wall_s": round(wall, 4),
        "cpu_s": round(cpu, 3),
        "busiest_bytes": int(busiest),
        "p50_get_s": round(float(np.percentile(gets, 50)), 5),
        "p99_get_s": round(float(np.percentile(gets, 99)), 5),
        "gets": len(gets),
        "tcv_bytes_eq2": tcv_eq2(samples, seq),
        "tcv_bytes_eq4": tcv_eq4(samples, seq, len(STAGES), len(nodes)),
        "nic_mbps": nic_mbps,
        "nodes": len(nodes),
        "busiest_link_s": round(link_s, 4),
        "foreign_cores": round(foreign, 2),
    }


def print_table(results: list[dict[str, Any]]) -> None:
    header = f"{'backend':<14}{'S':>3}{'samples':>8}{'SL':>6}{'wall s':>9}{'CPU s':>8}{'other':>7}{'link s':>8}" \
             f"{'busiest MB':>12}{'p50 get ms':>12}{'p99 get ms':>12}{'Eq2 MB':>9}{'Eq4 MB':>9}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['backend']:<14}{r['nodes']:>3}{r['samples']:>8}{r['seq_tokens']:>6}{r['wall_s']:>9.2f}"
              f"{r['cpu_s']:>8.2f}{r['foreign_cores']:>7.2f}{r['busiest_link_s']:>8.2f}{r['busiest_bytes'] / 2**20:>12.1f}"
              f"{r['p50_get_s'] * 1e3:>12.1f}{r['p99_get_s'] * 1e3:>12.1f}"
              f"{r['tcv_bytes_eq2'] / 2**20:>9.1f}{r['tcv_bytes_eq4'] / 2**20:>9.1f}")


def run_cluster(num_nodes: int, sizes: list[tuple[int, int]], backends: list[str],
                nic_mbps: float | None = None, micro: int | None = None) -> list[dict[str, Any]]:
    """Start a simulated ``num_nodes``-node cluster, run every size through every backend, stop the cluster.
    Under the bandwidth model a message holds MBs, so each node gets a 1 GiB object store (Ray's test default,
    150 MB, would spill the centralized buffer's answers to disk); unmodelled runs keep the default."""
    cluster, nodes = start_cluster(num_nodes, MODEL_STORE_BYTES if nic_mbps is not None else None)
    results: list[dict[str, Any]] = []
    try:
        if "transferqueue" in backends:
            import transfer_queue as tq
            from omegaconf import OmegaConf

            tq.init(OmegaConf.create({"controller": {"polling_mode": True},
                                      "backend": {"SimpleStorage": {"num_data_storage_units": num_nodes}}}))
        workers = [NodeWorker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                   for n in nodes]
        for samples, seq in sizes:
            for backend in backends:
                record = run_flow(backend, samples, seq, nodes, workers, nic_mbps, micro)
                results.append(record)
                print(f"{backend} S={num_nodes} {samples}x{seq}: {record['wall_s']:.2f}s", file=sys.stderr, flush=True)
    finally:
        if "transferqueue" in backends:
            import transfer_queue as tq

            tq.close()
        ray.shutdown()
        cluster.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--quick", action="store_true", help="one small size: a smoke run")
    parser.add_argument("--backends", default=None,
                        help="default: centralized,dock,transferqueue (centralized,dock under --nic-mbps)")
    parser.add_argument("--nodes", type=int, default=NODES, help="simulated Ray nodes (one warehouse each)")
    parser.add_argument("--sizes", default=None, help="SAMPLESxSL,... instead of the default sizes, e.g. 4096x2048")
    parser.add_argument("--nic-mbps", type=float, default=None,
                        help="the paper's bandwidth model: one link of this many MiB/s per node (default: off)")
    args = parser.parse_args(argv)
    modelled = args.nic_mbps is not None
    backends = (args.backends or ",".join(MODELLED_BACKENDS if modelled else (*MODELLED_BACKENDS, "transferqueue"))).split(",")
    if modelled and not set(backends) <= set(MODELLED_BACKENDS):
        parser.error("--nic-mbps models the network of DockFlow's backends (centralized, dock); "
                     "TransferQueue's transfers are not modelled, so compare it without --nic-mbps")
    sizes = QUICK_SIZES if args.quick else MODEL_SIZES if modelled else FULL_SIZES
    if args.sizes:
        sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
    results = run_cluster(args.nodes, sizes, backends, args.nic_mbps)
    write_results(args.out, results, ray=ray.__version__, nodes=args.nodes, quick=args.quick, nic_mbps=args.nic_mbps)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
