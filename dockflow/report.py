"""What a run shows in the terminal: a progress bar per iteration, then tables of held-out accuracy at each
evaluation (with tools: also tool calls and tool errors per trajectory), reward per iteration, the evaluation's fingerprint and, with a registry, what the champion gate
compared and its decision. ``dockflow train`` and
``dockflow pipeline run --local`` show the same."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _reward_window(rewards: list[float], lo: int, hi: int) -> str:
    window = rewards[lo:hi]
    return f"{sum(window) / len(window):.3f}" if window else "-"


TOOL_CALLS, TOOL_ERRORS = "eval/test_tool_calls", "eval/test_tool_errors"


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_train_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """Accuracy before/after RL, then one row per evaluation with the mean reward since the previous one."""
    console = console or Console()
    rewards = summary.get("reward_per_iteration", [])
    evals = summary.get("evals", [])
    tools = any(TOOL_CALLS in e for e in evals)  # a run with tools: its evaluations ran the tool loop
    title = "held-out accuracy (greedy, with tools), tool calls and errors per trajectory" if tools else (
        "held-out accuracy (greedy)")
    table = Table(title=f"DockFlow run '{summary['run_name']}': {title} and reward")
    table.add_column("iteration", justify="right")
    table.add_column("held-out accuracy", justify="right")
    if tools:
        table.add_column("tool calls / trajectory", justify="right")
        table.add_column("tool errors / trajectory", justify="right")
    table.add_column("mean reward (iterations since last row)", justify="right")
    prev = 0
    for e in evals:
        it = e["iteration"]
        label = "0 (SFT plateau)" if it == 0 else str(it)
        calls = [_number(e.get(TOOL_CALLS)), _number(e.get(TOOL_ERRORS))] if tools else []
        table.add_row(label, f"{e['accuracy']:.3f}", *calls, _reward_window(rewards, prev, it) if it else "-")
        prev = it
    console.print(table)
    before, after = summary.get("accuracy_before"), summary.get("accuracy_after")
    totals = Table(show_header=False, title="summary")
    totals.add_row("accuracy before RL (SFT plateau)", "-" if before is None else f"{before:.3f}")
    totals.add_row("accuracy after RL", "-" if after is None else f"{after:.3f}")
    if before is not None and after is not None:
        totals.add_row("gain (points)", f"{100 * (after - before):+.1f}")
    totals.add_row("iterations", str(summary["iterations"]))
    totals.add_row("throughput (Eq. 5, tokens/s/device)", f"{summary['throughput_tps']:.1f}")
    totals.add_row("seconds per iteration", f"{summary.get('seconds_per_iteration', 0.0):.3f}")
    totals.add_row("wall seconds", f"{summary['wall_seconds']:.1f}")
    totals.add_row("MLflow run id", str(summary["mlflow_run_id"]))
    evaluation = summary.get("evaluation")
    if evaluation:
        totals.add_row("evaluation fingerprint", f"{evaluation['fingerprint']} ({evaluation['num_prompts']} prompts, "
                       f"test set {evaluation['test_set']})")
    reg = summary.get("registry")
    if reg:
        totals.add_row("registered", f"{reg['model_name']} version {reg['version']} (score {reg['score']:.3f})")
        if reg.get("compared"):
            totals.add_row("compared", reg["compared"])
        totals.add_row("champion", reg["decision"])
    console.print(totals)


class ProgressBar:
    """``on_iteration(step, metrics)`` for a run: a tqdm bar from the first iteration, with s/it, reward and
    the latest held-out accuracy. Close it when the run ends."""

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.bar: Any = None

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        from tqdm.auto import tqdm

        if self.bar is None:  # starts with the first iteration, after SFT has printed its own
            self.bar = tqdm(total=self.iterations, initial=step - 1, desc="RL", unit="it", dynamic_ncols=True)
        if self.bar.n < step:
            self.bar.update(step - self.bar.n)
        post = {"s/it": f"{metrics.get('timing/iteration_s', 0.0):.2f}"}
        if "reward/mean" in metrics:  # DPO trains offline and has no reward
            post["reward"] = f"{metrics['reward/mean']:.3f}"
        if "eval/test_accuracy" in metrics:
            post["acc"] = f"{metrics['eval/test_accuracy']:.3f}"
        self.bar.set_postfix(post)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
