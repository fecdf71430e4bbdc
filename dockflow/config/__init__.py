"""The run's typed configuration: one ``Config`` of sections, loaded from YAML with dotted overrides.

    from dockflow.config import load_config
    cfg = load_config("configs/grpo_arith.yaml", ["train.iterations=10"])

The room, module by module: ``base`` (``Section``: the base of every section; ``flatten_dict``), ``sections``
(run, ray, data, model, sft, rollout, train, placement, dock, eval, checkpoint, registry, tracking), ``engine``
(``engine:``), ``reward`` (``reward:``), ``run`` (``Config``: the sections together with the checks across them,
and the loading). The ``algorithm:`` section is each algorithm's own, from its recipe (``dockflow.algos.recipes``).

Names are imported lazily (PEP 562): ``run`` imports the recipes, whose sections import ``base``, so importing
this package must not import ``run`` first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dockflow.config.base import flatten_dict
    from dockflow.config.data import ArithmeticConfig, DataConfig
    from dockflow.config.engine import CostModelConfig, EngineConfig, VLLMConfig
    from dockflow.config.reward import RewardConfig, RewardFunctionConfig, RewardModelConfig
    from dockflow.config.run import (
        Config,
        ConfigError,
        config_from_dict,
        load_config,
        parse_overrides,
    )
    from dockflow.config.sections import (
        CheckpointConfig,
        RayConfig,
        RegistryConfig,
        TinyModelConfig,
        TrackingConfig,
    )

_EXPORTS = {
    **dict.fromkeys(("Config", "ConfigError", "config_from_dict", "load_config", "parse_overrides"),
                    "dockflow.config.run"),
    "flatten_dict": "dockflow.config.base",
    **dict.fromkeys(("CostModelConfig", "EngineConfig", "VLLMConfig"), "dockflow.config.engine"),
    **dict.fromkeys(("RewardConfig", "RewardFunctionConfig", "RewardModelConfig"), "dockflow.config.reward"),
    **dict.fromkeys(("ArithmeticConfig", "DataConfig"), "dockflow.config.data"),
    **dict.fromkeys(("CheckpointConfig", "RayConfig", "RegistryConfig", "TinyModelConfig", "TrackingConfig"),
                    "dockflow.config.sections"),
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dockflow.config' has no attribute {name!r}")


__all__ = [
    "ArithmeticConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "CostModelConfig",
    "DataConfig",
    "EngineConfig",
    "RayConfig",
    "RegistryConfig",
    "RewardConfig",
    "RewardFunctionConfig",
    "RewardModelConfig",
    "TinyModelConfig",
    "TrackingConfig",
    "VLLMConfig",
    "config_from_dict",
    "flatten_dict",
    "load_config",
    "parse_overrides",
]
