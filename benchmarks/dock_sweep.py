"""Node sweep of the sample flow under the paper's bandwidth model: S = 1, 2, 4, 8 simulated Ray nodes, the
global batch growing with S (a fixed number of samples per node, as in the paper's linearity experiment).

Each S runs ``benchmarks.dock``'s flow (one worker per node hosting that node's rank of every stage, one
warehouse per node, controllers spread over the nodes) through the centralized buffer and the distributed
dock, side by side on one cluster, with every node's link modelled (``--nic-mbps``, MiB/s). Linearity is the
sample-flow throughput per node relative to S = 1: ``(samples / wall / S) / (samples_1 / wall_1)``.

All simulated nodes share this machine's cores, so the CPU work of the flow grows with S while each
link's load does not: the table carries CPU seconds and the busiest link's seconds next to the wall time,
which say what limits each point. Usage::

    python -m benchmarks.dock_sweep --nic-mbps 100 --out sweep.json [--nodes 1,2,4,8]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import ray

from benchmarks.dock import MODELLED_BACKENDS, run_cluster
from benchmarks.results_file import write_results

PER_NODE = 512  # samples per node (32 prompts x 16 responses)
SEQ = 16384  # response tokens SL (PL = SL / 2)
MICRO = 32  # samples per get and put, the same at every S


def linearity(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``per_node_samples_per_s`` and ``linearity`` (relative to the smallest S of the same backend)."""
    out = []
    base: dict[str, float] = {}
    for r in sorted(records, key=lambda r: (r["backend"], r["nodes"])):
        per_node = r["samples"] / r["wall_s"] / r["nodes"]
        base.setdefault(r["backend"], per_node)
        out.append({**r, "per_node_samples_per_s": round(per_node, 3),
                    "linearity": round(per_node / base[r["backend"]], 4)})
    return out


def print_table(records: list[dict[str, Any]]) -> None:
    header = f"{'backend':<13}{'S':>3}{'samples':>9}{'wall s':>9}{'CPU s':>8}{'other':>7}{'link s':>8}" \
             f"{'busiest MB':>12}{'per node/s':>12}{'linearity':>11}"
    print(header)
    print("-" * len(header))
    for r in records:
        print(f"{r['backend']:<13}{r['nodes']:>3}{r['samples']:>9}{r['wall_s']:>9.2f}{r['cpu_s']:>8.2f}"
              f"{r['foreign_cores']:>7.2f}{r['busiest_link_s']:>8.2f}{r['busiest_bytes'] / 2**20:>12.1f}"
              f"{r['per_node_samples_per_s']:>12.1f}{r['linearity']:>11.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--nic-mbps", type=float, default=100.0, help="modelled link per node, MiB/s")
    parser.add_argument("--nodes", default="1,2,4,8", help="cluster sizes S to run")
    parser.add_argument("--per-node", type=int, default=PER_NODE, help="samples per node")
    parser.add_argument("--seq", type=int, default=SEQ, help="response tokens SL (PL = SL / 2)")
    parser.add_argument("--micro", type=int, default=MICRO, help="samples per get and put")
    args = parser.parse_args(argv)
    records: list[dict[str, Any]] = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        size = (args.per_node * nodes, args.seq)
        records += run_cluster(nodes, [size], list(MODELLED_BACKENDS), args.nic_mbps, args.micro)
    records = linearity(records)
    write_results(args.out, records, ray=ray.__version__, nic_mbps=args.nic_mbps, per_node=args.per_node, seq=args.seq,
                  micro=args.micro)
    print_table(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
