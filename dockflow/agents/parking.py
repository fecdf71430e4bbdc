"""A rollout stopped by a token budget (partial rollout), kept with everything it needs to go on where it stopped.

    outs = run_rollouts(rows, generate_batch, tokenizer, tools, factories, limits, budget=4)
    parked = [o for o in outs if isinstance(o, ParkedTrajectory)]       # picklable: a queue, a checkpoint
    later = run_rollouts(parked, generate_batch, tokenizer, tools, factories, limits)   # each in its own turn

A parked rollout is its ``Trajectory`` as it was before the turn in progress (the turns taken, the ids and the
per-token model mask so far, the conversation, the tool-call counts) and the ids the model has generated so far
in that turn (none: it stopped between turns, after the last turn's tool calls ran). Resumed, the turn goes on
from those ids, and the trajectory is the one an uninterrupted loop would have built from the same tokens.

The environment lives in its rollout's forked child (per-call isolation: a hung call is killed with it). At
parking its instance is pickled in the child (``ToolHost.snapshot``) and the child is ended; the bytes travel
with the parked rollout (the rollout queue, a checkpoint); on resume a fresh child unpickles them
(``ToolHost(..., saved=)``) and the rollout's calls run there, under the same timeout. So an environment's state
survives parking exactly as far as its pickle carries it: what ``environments=`` already requires (an instance
holding an open socket or process needs ``__getstate__`` / ``__setstate__``; one that cannot be pickled stops the
run with a line naming its class). An environment already stopped (a killed call) stays stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dockflow.agents.environments import EnvironmentSpecError
from dockflow.agents.tool_host import ToolHost
from dockflow.agents.trajectory import Trajectory


@dataclass
class ParkedTrajectory:
    """A rollout stopped mid-turn or between turns by a token budget (see the module doc)."""

    trajectory: Trajectory  # as before the turn in progress: its turns, ids, mask, messages and metrics
    turn: list[int] = field(default_factory=list)  # ids of the turn in progress so far ([]: between turns)
    environment: str | None = None  # the environment's class name (None: tools only)
    factory: str | None = None  # with named factories: the row's 'environment' column, which picks it
    saved: bytes | None = None  # the environment instance, pickled in its child (ToolHost.snapshot)
    lost: str | None = None  # why its environment was stopped (a killed call), if it was

    @property
    def resumes_in(self) -> int:
        """The turn it goes on with (1 = the first model turn)."""
        return self.trajectory.metrics.turns + 1


def resumed_host(
    parked: ParkedTrajectory, tools: Sequence[Callable[..., Any]], factories: Any, timeout_s: float
) -> ToolHost:
    """A host for ``parked`` (its environment as it was parked, in a new child); tools-only rollouts share one
    host and never get here."""
    factory = factories
    if isinstance(factories, Mapping):
        if parked.factory not in factories:
            raise EnvironmentSpecError(
                f"a parked rollout's environment {parked.factory!r} is not among the named environments "
                f"{sorted(factories)}: resume with the tools.environments it was started with"
            )
        factory = factories[parked.factory]
    return ToolHost(tools, factory, timeout_s=timeout_s, saved=parked.saved, lost=parked.lost)
