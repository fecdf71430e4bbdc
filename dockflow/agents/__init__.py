"""Multi-turn tool use: tools and TRL-style environments, tool-call parsing, the tool loop (docs/agents.md).

Run by ``dockflow.rollout.multi_turn`` when a run configures ``tools:``, by held-out evaluation
(``dockflow.eval.tool_scores``) and by tool-use SFT (``dockflow.flow.tool_sft``).
"""

from dockflow.agents.batch_loop import (
    Rollout,
    ToolSpec,
    run_rollout,
    run_rollouts,
    tool_spec,
)
from dockflow.agents.environments import (
    EnvironmentSpecError,
    environment_methods,
    pick_factory,
    with_observation,
)
from dockflow.agents.parse import Malformed, ParsedTurn, ToolCall, parse_tool_calls
from dockflow.agents.tool_host import ToolError, ToolHost, ToolOutcome, import_tool, tool_schema
from dockflow.agents.trajectory import (
    Trajectory,
    TrajectoryMetrics,
    loop_template,
    run_trajectory,
    tool_suffix_ids,
    trajectory_steps,
)

__all__ = [
    "EnvironmentSpecError",
    "Malformed",
    "ParsedTurn",
    "Rollout",
    "ToolCall",
    "ToolError",
    "ToolHost",
    "ToolOutcome",
    "ToolSpec",
    "Trajectory",
    "TrajectoryMetrics",
    "environment_methods",
    "import_tool",
    "loop_template",
    "parse_tool_calls",
    "pick_factory",
    "run_rollout",
    "run_rollouts",
    "run_trajectory",
    "tool_schema",
    "tool_spec",
    "tool_suffix_ids",
    "trajectory_steps",
    "with_observation",
]
