"""The run's typed configuration: one ``Config`` of sections, loaded from YAML with dotted overrides.

    from dockflow.config import load_config
    cfg = load_config("configs/grpo_arith.yaml", ["train.iterations=10"])

The room, module by module: ``base`` (``Section``: the base of every section; ``flatten_dict``), ``sections``
(run, ray, data, model, sft, rollout, train, placement, dock, eval, checkpoint, registry, tracking), ``engine``
(``engine:``), ``reward`` (``reward:``), ``algorithm`` (``AlgorithmSection`` and the registry of algorithms that
``algorithm:`` is validated through; the role sections ``CriticSection``, ``PreferenceSection``), ``run``
(``Config``: the sections together with the checks across them, and the loading). The config imports no
algorithm: each algorithm's own section lives in its module of ``dockflow.algos``, which registers it.
"""

from __future__ import annotations

from dockflow.config.algorithm import AlgorithmSection, CriticSection, PreferenceSection
from dockflow.config.base import flatten_dict
from dockflow.config.data import ArithmeticConfig, DataConfig
from dockflow.config.engine import CostModelConfig, EngineConfig, VLLMConfig
from dockflow.config.reward import RewardConfig, RewardFunctionConfig, RewardModelConfig
from dockflow.config.run import Config, ConfigError, config_from_dict, load_config, parse_overrides
from dockflow.config.sections import (
    CheckpointConfig,
    LoraConfig,
    RayConfig,
    RegistryConfig,
    TinyModelConfig,
    TrackingConfig,
)

__all__ = [
    "AlgorithmSection",
    "ArithmeticConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "CostModelConfig",
    "CriticSection",
    "DataConfig",
    "EngineConfig",
    "LoraConfig",
    "PreferenceSection",
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
