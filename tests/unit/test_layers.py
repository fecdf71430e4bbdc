"""The lower layers take the config section they read, never the whole run: no module under storage, data,
models, rewards, tracking, eval, engines, reshard, dock or agents imports ``Config`` (nor anything else of
``dockflow.config.run``), nor the layers above them (``dockflow.rollout``, ``dockflow.workers``, ``dockflow.flow``,
``dockflow.cli``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dockflow.config

PACKAGE = Path(__file__).resolve().parents[2] / "dockflow"
LOWER = ("storage", "data", "models", "rewards", "tracking", "eval", "engines", "reshard", "dock", "agents")
RUN_MODULE = "dockflow.config.run"
# the names ``dockflow.config`` re-exports from ``dockflow.config.run`` (Config, load_config, ...)
RUN_EXPORTS = {name for name in dockflow.config.__all__
               if getattr(getattr(dockflow.config, name), "__module__", None) == RUN_MODULE}
UPPER = ("dockflow.rollout", "dockflow.flow", "dockflow.workers", "dockflow.cli")


def _absolute(module: str | None, level: int, path: Path) -> str:
    """The absolute module of ``from <level dots><module> import ...`` written in ``path``."""
    if not level:
        return module or ""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-level]
    return ".".join([*package, *([module] if module else [])])


def _is_upper(module: str) -> bool:
    return any(module == up or module.startswith(up + ".") for up in UPPER)


def violations(source: str, path: Path) -> list[str]:
    """Each import in ``source`` (at any depth, ``TYPE_CHECKING`` blocks included) that reaches the whole config
    or an upper layer, as ``"<line>: <what>"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            found += [f"{node.lineno}: import {n}" for n in names if n == RUN_MODULE or _is_upper(n)]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, path)
            for alias in node.names:
                full = f"{module}.{alias.name}"
                whole_config = module == RUN_MODULE or full == RUN_MODULE or (
                    module == "dockflow.config" and alias.name in RUN_EXPORTS
                )
                if whole_config or _is_upper(module) or _is_upper(full):
                    found.append(f"{node.lineno}: from {module} import {alias.name}")
    return found


def _modules() -> list[Path]:
    return sorted(p for pkg in LOWER for p in (PACKAGE / pkg).rglob("*.py"))


def test_lower_layers_import_neither_the_whole_config_nor_the_layers_above() -> None:
    broken = {}
    for path in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        if found := violations(path.read_text(), path):
            broken[rel] = found
    assert not broken, f"pass these modules the sections they read instead: {broken}"


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ("from dockflow.config import Config", True),
        ("from dockflow.config import load_config", True),
        ("from dockflow.config.run import flatten_dict", True),
        ("import dockflow.config.run", True),
        ("from dockflow.config import run", True),
        ("from dockflow.flow.trainer import train", True),
        ("from dockflow import workers", True),
        ("from dockflow.rollout.plain import dock_columns", True),
        ("from dockflow import rollout", True),
        ("import dockflow.cli", True),
        ("from ..flow import run_checkpoint", True),
        ("from dockflow.config import CheckpointConfig, flatten_dict", False),
        ("from dockflow.config.sections import DataConfig", False),
        ("from dockflow.config.engine import EngineConfig", False),
        ("from dockflow.storage import open_store", False),
        ("from ..data import load_task", False),
        ("from dockflow.flowers import x", False),
    ],
)
def test_the_check_tells_whole_config_and_upper_imports_apart(line: str, bad: bool) -> None:
    source = f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    {line}\n"
    assert bool(violations(source, PACKAGE / "eval" / "command.py")) is bad
