"""TRL's ``environment_factory`` convention (TRL 1.16, GRPOTrainer), so an environment written for TRL runs here:

    class Counter:
        def reset(self, **row) -> str | None:        # the dataset row's columns as keyword arguments
            self.n = 0
        def increment(self, by: int) -> int:         # every public method is a tool (type hints + docstring)
            '''Add to the counter. Args: by: how much.'''
            self.n += by
            return self.n
        def get_reward(self) -> float:               # optional: scores the finished rollout, logged as "Counter"
            return float(self.n == 3)

One instance per rollout. A factory is one callable, or a dict of named factories with each row's
``environment`` column picking one (that column is not passed to ``reset``). Each class that defines
``get_reward`` is a reward source of weight 1 named after the class (``reward_environments``), and reward
functions get the rollouts' instances as ``environments=``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

EnvironmentFactory = Callable[[], Any]
_NOT_TOOLS = ("reset", "get_reward")


class EnvironmentSpecError(ValueError):
    """A row names no known environment, or an environment breaks TRL's convention; the message says which."""


def environment_methods(instance: Any) -> dict[str, Callable[..., Any]]:
    """The tools of an environment instance: its public methods but ``reset`` and ``get_reward``, read from the
    class as TRL does (``inspect.getmembers`` on the instance would evaluate properties)."""
    members = dict(inspect.getmembers(type(instance), predicate=inspect.isfunction))
    if "reset" not in members:
        raise EnvironmentSpecError(
            f"environment {type(instance).__name__!r} has no reset method: TRL's environment_factory "
            "needs reset(self, **row) (it may return text appended to the last user message)"
        )
    return {
        name: getattr(instance, name)
        for name in members
        if name not in _NOT_TOOLS and not name.startswith("_")
    }


def pick_factory(
    factories: EnvironmentFactory | Mapping[str, EnvironmentFactory], row: Mapping[str, Any]
) -> tuple[EnvironmentFactory, dict[str, Any]]:
    """The factory of ``row`` and the keyword arguments its ``reset`` gets."""
    if not isinstance(factories, Mapping):
        return factories, dict(row)
    name = row.get("environment")
    if name not in factories:
        raise EnvironmentSpecError(
            f"row has environment={name!r}, which is not among the named environments "
            f"{sorted(factories)}: set the row's 'environment' column to one of them"
        )
    return factories[name], {k: v for k, v in row.items() if k != "environment"}


def with_observation(messages: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """The prompt with ``reset``'s observation appended to the last message's text (a new list; None: unchanged)."""
    if observation is None:
        return list(messages)
    last = messages[-1]
    return [*messages[:-1], {**last, "content": last["content"] + str(observation)}]


def reward_environments(factories: EnvironmentFactory | Mapping[str, EnvironmentFactory] | None) -> list[str]:
    """The class names of the environments that own a reward (define ``get_reward``), once per class, in the
    factories' order: each is an extra reward source of weight 1 named after its class, as in TRL's GRPOTrainer
    (which probes one instance per factory the same way)."""
    if factories is None:
        return []
    out: list[str] = []
    for factory in factories.values() if isinstance(factories, Mapping) else [factories]:
        cls = type(factory())
        members = dict(inspect.getmembers(cls, predicate=inspect.isfunction))
        if "get_reward" in members and cls.__name__ not in out:
            out.append(cls.__name__)
    return out
