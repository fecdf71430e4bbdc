"""Sample flow of one GRPO iteration through three backends, side by side on a simulated 4-node Ray cluster:
(a) the centralized buffer, (b) the distributed transfer dock, (c) TransferQueue (PyPI, SimpleStorage).

One worker actor per node hosts that node's DP rank of every stage (a thread each): generate puts prompts
and responses; old_logp, ref, reward and advantage read their inputs and put their outputs; update reads
everything. Stages stream: each starts at once and waits only for the samples it needs.

Reported per backend and size: wall seconds of the flow, bytes through the busiest dock process, p50/p99
get latency as consumers see it, and the paper's analytical volumes, Eq. (2) (centralized) and Eq. (4)
(per warehouse). Usage: ``python -m benchmarks.dock --out dock.json [--quick]``.
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
QUICK_SIZES = [(64, 64)]


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

    def setup(self, backend: str, dock: Any, samples: int, seq: int, num_nodes: int) -> None:
        self.backend, self.dock, self.samples, self.seq = backend, dock, samples, seq
        self.num_nodes = num_nodes
        self.mb = micro_batch(samples)
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
            handle = self.dock.get(consumer, self.mb, columns, whole_groups=whole, timeout_s=600).indices
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


def start_cluster(num_nodes: int) -> tuple[Cluster, list[str]]:
    head = {"num_cpus": 4, "resources": {"bench_node_0": 1}, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for i in range(1, num_nodes):
        cluster.add_node(num_cpus=4, resources={f"bench_node_{i}": 1})  # logical CPUs for TransferQueue's actors
    ray.init(address=cluster.address, namespace="dock-benchmark", log_to_driver=False)
    by_resource = {r: n["NodeID"] for n in ray.nodes() if n["Alive"] for r in n["Resources"] if r.startswith("bench_node_")}
    return cluster, [by_resource[f"bench_node_{i}"] for i in range(num_nodes)]


def ray_cpu_seconds() -> dict[int, float]:
    """CPU seconds so far of every process of the simulated cluster (raylets, GCS, actors) and this driver.

    All simulated nodes share this machine's cores, so when the flow is CPU-bound its wall time is about
    this total divided by the core count, whatever the design spreads over nodes."""
    out = {}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if proc.pid == os.getpid() or cmdline.startswith("ray::") or "raylet" in cmdline or "gcs_server" in cmdline:
                times = proc.cpu_times()
                out[proc.pid] = times.user + times.system
        except psutil.Error:
            pass
    return out


def run_flow(backend: str, samples: int, seq: int, nodes: list[str], workers: list[Any]) -> dict[str, Any]:
    from dockflow.dock import DockSpec, create_dock

    dock = None
    if backend in ("centralized", "dock"):
        spec = DockSpec(columns=DTYPES, capacity=samples, group_size=GROUP, warehouse_nodes=nodes,
                        backend="centralized" if backend == "centralized" else "distributed",
                        name=f"bench-{backend}-{samples}-{seq}", get_timeout_s=600,
                        shard_block=samples // len(nodes))  # warehouse k holds the share node k generates
        dock = create_dock(spec)
        for k, (consumer, reads, _, _) in enumerate(STAGES):
            dock.register_consumer(consumer, reads, node_id=nodes[k % len(nodes)])  # next to one of its ranks
    ray.get([w.setup.remote(backend, dock, samples, seq, len(nodes)) for w in workers])
    cpu_before = ray_cpu_seconds()
    started = time.perf_counter()
    calls = [w.generate.remote(rank) for rank, w in enumerate(workers)]
    calls += [w.consume.remote(stage) for w in workers for stage in range(len(STAGES))]
    results = ray.get(calls, timeout=900)
    wall = time.perf_counter() - started
    cpu = sum(c - cpu_before.get(pid, 0.0) for pid, c in ray_cpu_seconds().items())
    gets = np.array([t for r in results for t in r["gets"]])
    if backend == "transferqueue":
        per_unit: dict[int, int] = defaultdict(int)
        for unit_bytes in ray.get([w.tq_unit_bytes.remote() for w in workers]):
            for unit, n in unit_bytes.items():
                per_unit[unit] += n
        busiest = max(per_unit.values())
    else:
        busiest = dock.stats()["busiest_bytes"]
    ray.get([w.teardown.remote() for w in workers])
    if dock is not None:
        dock.shutdown()
    return {
        "backend": backend,
        "samples": samples,
        "seq_tokens": seq,
        "prompt_tokens": seq // 2,
        "micro_batch": micro_batch(samples),
        "wall_s": round(wall, 4),
        "cpu_s": round(cpu, 3),
        "busiest_bytes": int(busiest),
        "p50_get_s": round(float(np.percentile(gets, 50)), 5),
        "p99_get_s": round(float(np.percentile(gets, 99)), 5),
        "gets": len(gets),
        "tcv_bytes_eq2": tcv_eq2(samples, seq),
        "tcv_bytes_eq4": tcv_eq4(samples, seq, len(STAGES), len(nodes)),
    }


def print_table(results: list[dict[str, Any]]) -> None:
    header = f"{'backend':<14}{'samples':>8}{'SL':>6}{'wall s':>9}{'CPU s':>8}{'busiest MB':>12}{'p50 get ms':>12}" \
             f"{'p99 get ms':>12}{'Eq2 MB':>9}{'Eq4 MB':>9}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['backend']:<14}{r['samples']:>8}{r['seq_tokens']:>6}{r['wall_s']:>9.2f}{r['cpu_s']:>8.2f}"
              f"{r['busiest_bytes'] / 2**20:>12.1f}{r['p50_get_s'] * 1e3:>12.1f}{r['p99_get_s'] * 1e3:>12.1f}"
              f"{r['tcv_bytes_eq2'] / 2**20:>9.1f}{r['tcv_bytes_eq4'] / 2**20:>9.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--quick", action="store_true", help="one small size: a smoke run")
    parser.add_argument("--backends", default="centralized,dock,transferqueue")
    parser.add_argument("--nodes", type=int, default=NODES, help="simulated Ray nodes (one warehouse each)")
    parser.add_argument("--sizes", default=None, help="SAMPLESxSL,... instead of the default sizes, e.g. 4096x2048")
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.sizes:
        sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
    cluster, nodes = start_cluster(args.nodes)
    results: list[dict[str, Any]] = []
    try:
        if "transferqueue" in backends:
            import transfer_queue as tq
            from omegaconf import OmegaConf

            tq.init(OmegaConf.create({"controller": {"polling_mode": True},
                                      "backend": {"SimpleStorage": {"num_data_storage_units": args.nodes}}}))
        workers = [NodeWorker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                   for n in nodes]
        for samples, seq in sizes:
            for backend in backends:
                record = run_flow(backend, samples, seq, nodes, workers)
                results.append(record)
                print(f"{backend} {samples}x{seq}: {record['wall_s']:.2f}s", file=sys.stderr, flush=True)
    finally:
        if "transferqueue" in backends:
            import transfer_queue as tq

            tq.close()
        ray.shutdown()
        cluster.shutdown()
    write_results(args.out, results, ray=ray.__version__, nodes=args.nodes, quick=args.quick)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
