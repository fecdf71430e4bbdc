"""The paper's Table 1 at its own scale, by simulation: one GRPO iteration of each Table 1 configuration through
the centralized buffer and the distributed dock with S = 16, 48, 128 and 384 warehouses (one per node), on a
virtual clock with 100 MB/s and 1 GB/s links (the paper's T100 and T1K; MB = MiB, as its 1 GB = 1024 MB),
and the sample flow's linearity as the paper's experiment grows the batch with the cluster.

The protocol simulator (``dock_sim_engine.py``) drives the dock's own bookkeeping (``ControllerState``,
``ShardMap``, ``dockflow.dock.protocol``); no Ray, no tensors. Warehouse k holds what node k generates (the
paper's split along the global batch) when S divides G, else groups are dealt round-robin (the DockSpec
default). Usage::

    python -m benchmarks.dock_sim --out sim.json            # Table 1 x S, then linearity (a few minutes)
    python -m benchmarks.dock_sim --out sim.json --quick    # configurations 1-2, S = 16 and 48
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks.dock_sim_engine import FlowSim, Shape, grpo_flow
from benchmarks.results_file import write_results

K = 1024
GIB = 2**30
# Table 1 of the paper: (G, N, PL, n, SL, M) and its printed TCV (GB), T100 and T1K (s), each with the step of
# its last printed digit (the table rounds or truncates to it).
TABLE1: list[tuple[Shape, tuple[tuple[float, float], ...]]] = [
    (Shape(256, 8, 2 * K, 5, 8 * K, 3), ((0.96, 0.01), (9.92, 0.01), (0.97, 0.01))),
    (Shape(256, 16, 2 * K, 5, 16 * K, 3), ((3.81, 0.01), (39.0, 0.1), (3.81, 0.01))),
    (Shape(1 * K, 16, 2 * K, 5, 16 * K, 3), ((15.2, 0.1), (156.1, 0.1), (15.2, 0.1))),
    (Shape(1 * K, 32, 4 * K, 8, 32 * K, 5), ((97.0, 0.1), (993.3, 0.1), (97.0, 0.1))),
    (Shape(4 * K, 32, 4 * K, 8, 32 * K, 5), ((388.0, 0.1), (3900.0, 100.0), (388.0, 0.1))),
    (Shape(8 * K, 64, 4 * K, 8, 64 * K, 5), ((3100.0, 100.0), (31000.0, 1000.0), (3100.0, 100.0))),
]
# The linearity experiment: a fixed number of prompts per node (the paper: 64), the paper's end-to-end shape.
LINEARITY = Shape(64, 16, 2 * K, 5, 8 * K, 3)
NODES = (16, 48, 128, 384)
BANDWIDTHS = (100.0, 1024.0)  # MiB/s: the paper's 100 MB/s and 1 GB/s


def tcv_eq2(s: Shape) -> int:
    """Eq. (2) in bytes: G N B (2PL + 3n SL + 8M)."""
    return s.samples * s.dtype_bytes * (2 * s.prompt_len + 3 * s.items * s.seq_len + 8 * s.scalars)


def tcv_eq4(s: Shape, consumers: int, warehouses: int) -> float:
    """Eq. (4) in bytes: G N B [2PL + 3n SL + 8(C+1)M] / S."""
    body = 2 * s.prompt_len + 3 * s.items * s.seq_len + 8 * (consumers + 1) * s.scalars
    return s.samples * s.dtype_bytes * body / warehouses


def within_rounding(value: float, printed: float, step: float) -> bool:
    """Whether ``printed`` is ``value`` rounded or truncated to a multiple of ``step`` (its last digit)."""
    return abs(value - printed) < step * (1 + 1e-9)


def simulate(shape: Shape, backend: str, nodes: int, mib_per_s: float, gets: int) -> dict[str, Any]:
    """One iteration; the record the tables and the JSON carry."""
    even = shape.prompts % nodes == 0
    started = time.perf_counter()
    sim = FlowSim(shape, backend, nodes, mib_per_s, gets_per_rank=gets,
                  shard_block=shape.samples // nodes if even else 0).run()
    busiest = max(sim.procs, key=lambda p: p.bytes)
    consumers = len(grpo_flow(shape.items)[1])
    return {
        "backend": backend, "nodes": nodes, "mib_per_s": mib_per_s, "prompts": shape.prompts,
        "responses": shape.responses, "samples": shape.samples, "prompt_len": shape.prompt_len,
        "items": shape.items, "seq_len": shape.seq_len, "scalars": shape.scalars, "consumers": consumers,
        "layout": "share" if even else "group", "gets_per_rank": gets,
        "dispatch_s": round(sim.finish, 4),
        "busiest_link_s": round(max(link.busy_s for link in sim.links), 4),
        "busiest_process": busiest.name, "busiest_bytes": busiest.bytes,
        "busiest_data_bytes": busiest.data_in + busiest.data_out,
        "messages": sum(p.msgs_in + p.msgs_out for p in sim.procs),
        "tcv_bytes_eq2": tcv_eq2(shape), "tcv_bytes_eq4": round(tcv_eq4(shape, consumers, nodes)),
        "sim_cpu_s": round(time.perf_counter() - started, 2),
    }


def run_table1(rows: list[int], nodes: list[int], bandwidths: list[float], gets: int) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        shape, printed = TABLE1[row]
        for s in nodes:
            for backend in ("centralized", "distributed"):
                for bw in bandwidths:
                    record = simulate(shape, backend, s, bw, gets)
                    record.update(kind="table1", row=row + 1, paper_tcv_gb=printed[0][0], paper_t100_s=printed[1][0],
                                  paper_t1k_s=printed[2][0],
                                  tcv_matches_paper=within_rounding(tcv_eq2(shape) / GIB, *printed[0]))
                    out.append(record)
                    print(f"row {row + 1} S={s} {backend} {bw:g} MiB/s: {record['dispatch_s']:.2f}s "
                          f"(simulated in {record['sim_cpu_s']}s)", file=sys.stderr, flush=True)
    return out


def run_linearity(nodes: list[int], bandwidths: list[float], gets: int, per_node: int) -> list[dict[str, Any]]:
    """The batch grows with the cluster (``per_node`` prompts per node); linearity relative to the smallest S."""
    out = []
    for bw in bandwidths:
        for backend in ("centralized", "distributed"):
            base = None
            for s in nodes:
                shape = Shape(per_node * s, LINEARITY.responses, LINEARITY.prompt_len, LINEARITY.items,
                              LINEARITY.seq_len, LINEARITY.scalars)
                record = simulate(shape, backend, s, bw, gets)
                per_node_rate = shape.samples / record["dispatch_s"] / s
                base = base or per_node_rate
                record.update(kind="linearity", per_node_samples_per_s=round(per_node_rate, 3),
                              linearity=round(per_node_rate / base, 4))
                out.append(record)
                print(f"linearity S={s} {backend} {bw:g} MiB/s: {record['dispatch_s']:.2f}s", file=sys.stderr, flush=True)
    return out


def print_tables(records: list[dict[str, Any]]) -> None:
    table1 = [r for r in records if r["kind"] == "table1"]
    if table1:
        print("Centralized buffer against the paper's Table 1 (T sim at the smallest and largest S)")
        print(f"{'row':>3}{'G':>6}{'N':>4}{'PL':>6}{'n':>3}{'SL':>7}{'M':>3}{'Eq2 GB':>10}{'sim GB':>10}{'paper':>8}"
              f"{'match':>7}{'T100 paper':>12}{'T100 sim':>18}{'T1K paper':>11}{'T1K sim':>16}")
        for row in sorted({r["row"] for r in table1}):
            rs = [r for r in table1 if r["row"] == row and r["backend"] == "centralized"]
            first, last = min(r["nodes"] for r in rs), max(r["nodes"] for r in rs)
            t = {(r["nodes"], r["mib_per_s"]): r["dispatch_s"] for r in rs}
            r = rs[0]
            t100 = f"{t.get((first, 100.0), 0):.5g}/{t.get((last, 100.0), 0):.5g}"
            t1k = f"{t.get((first, 1024.0), 0):.4g}/{t.get((last, 1024.0), 0):.4g}"
            print(f"{row:>3}{r['prompts']:>6}{r['responses']:>4}{r['prompt_len']:>6}{r['items']:>3}{r['seq_len']:>7}"
                  f"{r['scalars']:>3}{r['tcv_bytes_eq2'] / GIB:>10.3f}{r['busiest_bytes'] / GIB:>10.3f}"
                  f"{r['paper_tcv_gb']:>8g}{'yes' if r['tcv_matches_paper'] else 'NO':>7}{r['paper_t100_s']:>12g}"
                  f"{t100:>18}{r['paper_t1k_s']:>11g}{t1k:>16}")
        print("\nDistributed dock: busiest process against Eq. (4); dispatch time on the virtual clock")
        print(f"{'row':>3}{'S':>5}{'layout':>7}{'busiest GB':>12}{'Eq4 GB':>10}{'/Eq4':>7}{'dock T100':>11}"
              f"{'dock T1K':>10}{'central T100':>14}{'speedup':>9}")
        for r in [r for r in table1 if r["backend"] == "distributed" and r["mib_per_s"] == BANDWIDTHS[0]]:
            peers = {(p["backend"], p["mib_per_s"]): p for p in table1 if p["row"] == r["row"] and p["nodes"] == r["nodes"]}
            t1k = peers.get(("distributed", BANDWIDTHS[1]), {}).get("dispatch_s", float("nan"))
            central = peers[("centralized", BANDWIDTHS[0])]["dispatch_s"]
            print(f"{r['row']:>3}{r['nodes']:>5}{r['layout']:>7}{r['busiest_bytes'] / GIB:>12.3f}"
                  f"{r['tcv_bytes_eq4'] / GIB:>10.3f}{r['busiest_bytes'] / r['tcv_bytes_eq4']:>7.3f}"
                  f"{r['dispatch_s']:>11.4g}{t1k:>10.4g}{central:>14.5g}{central / r['dispatch_s']:>8.0f}x")
    lin = [r for r in records if r["kind"] == "linearity"]
    if lin:
        print("\nLinearity: the batch grows with the cluster (prompts per node fixed); dispatch time per iteration")
        print(f"{'MiB/s':>7}{'S':>5}{'samples':>9}{'central s':>11}{'linearity':>11}{'dock s':>9}{'linearity':>11}")
        for r in [r for r in lin if r["backend"] == "centralized"]:
            d = next(x for x in lin if x["backend"] == "distributed" and x["nodes"] == r["nodes"]
                     and x["mib_per_s"] == r["mib_per_s"])
            print(f"{r['mib_per_s']:>7g}{r['nodes']:>5}{r['samples']:>9}{r['dispatch_s']:>11.4g}{r['linearity']:>11.1%}"
                  f"{d['dispatch_s']:>9.4g}{d['linearity']:>11.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--quick", action="store_true", help="rows 1-2, S = 16 and 48: a smoke run")
    parser.add_argument("--rows", default=None, help="Table 1 rows to run, e.g. 1,2,3 (default: all six)")
    parser.add_argument("--nodes", default=None, help="warehouse (node) counts S, default 16,48,128,384")
    parser.add_argument("--gets-per-rank", type=int, default=4, help="gets (and puts) per rank and state")
    parser.add_argument("--per-node", type=int, default=LINEARITY.prompts, help="linearity: prompts per node")
    parser.add_argument("--skip-table1", action="store_true")
    parser.add_argument("--skip-linearity", action="store_true")
    args = parser.parse_args(argv)
    nodes = [int(s) for s in args.nodes.split(",")] if args.nodes else [16, 48] if args.quick else list(NODES)
    rows = [int(r) - 1 for r in args.rows.split(",")] if args.rows else [0, 1] if args.quick else list(range(6))
    records: list[dict[str, Any]] = []
    if not args.skip_table1:
        records += run_table1(rows, nodes, list(BANDWIDTHS), args.gets_per_rank)
    if not args.skip_linearity:
        records += run_linearity(nodes, list(BANDWIDTHS), args.gets_per_rank, args.per_node)
    write_results(args.out, records, simulator="benchmarks/dock_sim_engine.py", quick=args.quick)
    print_tables(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
