"""The tables ``benchmarks/vs_trl.py`` prints: each run's throughput and accuracy, where an iteration's time goes,
and the verdict per setup and DockFlow schedule (the median DockFlow/TRL ratio over the pairs)."""

from __future__ import annotations

from typing import Any


def print_table(results: list[dict[str, Any]], comparison: list[dict[str, Any]]) -> None:
    """The runs, their phases, and one verdict line per setup and DockFlow schedule."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="DockFlow vs TRL GRPOTrainer (CPU): Eq. (5) throughput and held-out greedy accuracy")
    cols = ("setup", "pair", "system", "mode", "iters", "G x N", "PL", "SL", "s/iter", "tok/s/dev", "acc before", "after", "gain", "wall s",
            "other load")
    for col in cols:
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            r["setup"], str(r.get("pair", 0)), r["system"], r.get("mode", "sync"), str(r["iterations"]), f"{r['samples_per_iteration']:.0f}",
            f"{r['prompt_length']:.1f}", f"{r['response_length']:.1f}", f"{r['seconds_per_iteration']:.2f}",
            f"{r['tps']:.0f}", f"{r['accuracy_before']:.3f}", f"{r['accuracy_after']:.3f}",
            f"{r['accuracy_gain']:+.3f}", f"{r['wall_s']:.0f}", f"{r.get('foreign_cores', 0.0):.2f} cores",
        )
    console = Console(width=150)
    console.print(table)
    phases = Table(title="Where an iteration's time goes (mean seconds; DockFlow's reward/advantage overlap generation)")
    names = ("generate", "score", "reward", "advantage", "old_log_prob", "update", "reshard", "other")
    for col in ("setup", "pair", "system", "mode", *names):
        phases.add_column(col, justify="right")
    for r in results:
        phases.add_row(r["setup"], str(r.get("pair", 0)), r["system"], r.get("mode", "sync"), *(f"{r['phase_s'][n]:.3f}" if n in r["phase_s"] else "-" for n in names))
    console.print(phases)
    for c in comparison:
        verdict = "met" if c["throughput_target_met"] else "NOT met"
        each = ", ".join(f"{x:.2f}" for x in c["tps_ratios"])
        console.print(
            f"{c['setup']}: DockFlow ({c['mode']})/TRL throughput {c['tps_ratio']:.2f}x, the median of {c['pairs']} "
            f"pair(s) ({each}); target {c['target_ratio']}x: {verdict}, stretch {c['stretch_ratio']}x: "
            f"{'met' if c['stretch_met'] else 'not met'}; accuracy gain DockFlow {c['accuracy_gain_dockflow']:+.3f} vs "
            f"TRL {c['accuracy_gain_trl']:+.3f}"
        )
        per_seed = "; ".join(f"seed {g['seed']}: DockFlow {g['dockflow']:+.3f}, TRL {g['trl']:+.3f}"
                             for g in c.get("gains_by_seed", []))
        console.print(f"  accuracy gain per seed ({c['setup']}, {c['mode']}): {per_seed}")
