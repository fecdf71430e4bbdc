"""The ``algorithm:`` section's base and the registry that ``Config`` validates it through.

The config does not know the algorithms: each one registers itself (``dockflow.algos``: ``RECIPES``, which
``dockflow/__init__.py`` imports, so the built-in ones are registered before any config is validated)::

    register_algorithm(GRPO())           # its name, its section class, what Config's cross-section checks ask
    algorithm_rules("grpo").section      # -> GRPOSection
    algorithm_names()                    # -> ["cispo", "dapo", ...]

``Config.algorithm`` looks ``algorithm.name`` up here and validates the block with that algorithm's section
(``validate_algorithm``); what ``Config``'s checks across sections need of an algorithm is ``AlgorithmRules``.
The role sections (``CriticSection``, ``PreferenceSection``) are here too: workers and lower layers (engines,
data) read them through the run plan (``Role.section``) without importing any algorithm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import Field
from pydantic_core import PydanticCustomError

from dockflow.config.base import Section

if TYPE_CHECKING:
    from dockflow.config.run import Config

DEFAULT_ALGORITHM = "grpo"  # a config without an algorithm: section


class AlgorithmSection(Section):
    """Fields every algorithm's section has; an algorithm's own section adds its knobs (``name`` is a Literal there)."""

    name: str


class AlgorithmRules(Protocol):
    """What ``Config``'s checks across sections need of an algorithm (an ``dockflow.algos.base.Algorithm``)."""

    name: str  # algorithm.name
    section: type[AlgorithmSection]  # its algorithm: block
    offline: bool  # trains on a dataset's preference pairs: no rollouts, no reward worker

    def check(self, cfg: Config) -> None:
        """Raise ValueError, with the reason and the keys to change, for a config this algorithm cannot run."""
        ...

    def samples_in_rounds(self, cfg: Config) -> bool:
        """Whether an iteration generates in several rounds, selecting groups (DAPO's dynamic sampling)."""
        ...


ALGORITHMS: dict[str, AlgorithmRules] = {}  # algorithm.name -> its rules, in registration order


def register_algorithm(rules: AlgorithmRules) -> None:
    """Make ``rules.name`` a valid ``algorithm.name``, validated with ``rules.section``."""
    ALGORITHMS[rules.name] = rules


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS)


def algorithm_rules(name: str) -> AlgorithmRules:
    """The registered algorithm ``name``; a one-line error naming the known ones otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}: algorithm.name is one of {algorithm_names()}") from None


def section_classes() -> list[type[AlgorithmSection]]:
    """Every registered algorithm's section class, once each (for the valid keys of an error message)."""
    return list(dict.fromkeys(r.section for r in ALGORITHMS.values()))


def default_algorithm() -> AlgorithmSection:
    return ALGORITHMS[DEFAULT_ALGORITHM].section()


def validate_algorithm(value: Any) -> AlgorithmSection:
    """An ``algorithm:`` block -> its algorithm's section (by ``name``): pydantic's errors of that section, with
    their keys under ``algorithm``; an unknown or missing name is an ``unknown_algorithm`` error."""
    if isinstance(value, AlgorithmSection):
        return value
    if not isinstance(value, dict):
        raise PydanticCustomError("algorithm_block", "the algorithm section must be a mapping with a name")
    name = value.get("name", DEFAULT_ALGORITHM)
    if not isinstance(name, str) or name not in ALGORITHMS:
        raise PydanticCustomError("unknown_algorithm", "unknown algorithm.name {name}", {"name": repr(name)})
    return ALGORITHMS[name].section.model_validate(value)


class RoleSection(Section):
    """Settings a worker role reads through the plan (``Role.section``), not by the algorithm's name; ``key`` is
    where they sit in a config, so that a message names the key to change."""

    key: ClassVar[str]

    def key_of(self, field: str) -> str:
        """The dotted config key of one of these settings (``algorithm.dpo.pairs_path``)."""
        return f"{self.key}.{field}"


class CriticSection(RoleSection):
    """What the critic worker reads: its value clip and learning rate."""

    value_clip: float = Field(0.2, gt=0.0, description="Clip range of the value update around the old values.")
    critic_lr: float = Field(1e-3, gt=0.0, description="Critic learning rate (AdamW).")


class PreferenceSection(RoleSection):
    """What the pair source reads: the preference pairs' file and the held-out count."""

    pairs_path: str | None = Field(
        None, description="JSONL of {prompt, chosen, rejected} (a local path or s3://); null = synthetic pairs from the task."
    )
    num_eval_pairs: int = Field(200, ge=1, description="Held-out pairs (from the test split) for the margin metric.")
