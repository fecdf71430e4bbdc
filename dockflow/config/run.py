"""Typed run configuration: pydantic models, YAML loading and dotted command-line overrides.

A config is one YAML file (see ``configs/``) whose keys mirror ``Config``'s sections (``dockflow.config.sections``;
the ``algorithm:`` section is the chosen algorithm's own, looked up by name in ``dockflow.config.algorithm``'s
registry, where each algorithm module of ``dockflow.algos`` registers itself). Every
key that a run needs is written in the example YAML; the defaults only fill keys that a user may leave out.
Unknown or mistyped keys are errors that name the key and the nearest valid one; the checks across sections
live here (each algorithm adds its own), the same for ``dockflow train`` and the pipeline::

    cfg = load_config("configs/grpo_arith.yaml", ["train.iterations=10", "rollout.temperature=0.8"])
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from dockflow.config.algorithm import (
    AlgorithmSection,
    algorithm_names,
    algorithm_rules,
    default_algorithm,
    section_classes,
    validate_algorithm,
)
from dockflow.config.base import Section, flatten_dict, renamed_key
from dockflow.config.data import ArithmeticConfig, DataConfig
from dockflow.config.engine import CostModelConfig, EngineConfig, VLLMConfig
from dockflow.config.moe import check_moe
from dockflow.config.reward import RewardConfig, RewardFunctionConfig, RewardModelConfig
from dockflow.config.router_replay import check_router_replay
from dockflow.config.sections import (
    CheckpointConfig,
    DockConfig,
    EvalConfig,
    FaultToleranceConfig,
    ModelConfig,
    PartialRolloutConfig,
    PlacementConfig,
    RayConfig,
    RegistryConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    TinyModelConfig,
    TrackingConfig,
    TrainConfig,
)
from dockflow.config.tools import ToolsConfig

__all__ = [
    "AlgorithmSection", "ArithmeticConfig", "CheckpointConfig", "Config", "ConfigError", "CostModelConfig", "DataConfig",
    "DockConfig", "EngineConfig", "EvalConfig", "FaultToleranceConfig", "ModelConfig", "PartialRolloutConfig",
    "PlacementConfig", "RayConfig", "RegistryConfig", "RewardConfig", "RewardFunctionConfig", "RewardModelConfig",
    "RolloutConfig", "RunConfig", "SFTConfig", "TinyModelConfig", "ToolsConfig",
    "TrackingConfig", "TrainConfig", "VLLMConfig", "config_from_dict", "flatten_dict", "load_config", "parse_overrides",
]


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key and what to do."""


class Config(Section):
    """The whole run: one section per subsystem."""

    run: RunConfig = Field(default_factory=RunConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algorithm: SerializeAsAny[AlgorithmSection] = Field(default_factory=default_algorithm)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    dock: DockConfig = Field(default_factory=DockConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    fault_tolerance: FaultToleranceConfig = Field(default_factory=FaultToleranceConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm_section(cls, value: Any) -> AlgorithmSection:
        """The ``algorithm:`` block as its algorithm's own section (``dockflow.config.algorithm``'s registry)."""
        return validate_algorithm(value)

    @model_validator(mode="after")
    def _check(self) -> Config:
        """Rules across sections, each with its reason; the algorithm's own rules come from its recipe."""
        samples, tc = self.global_batch, self.train
        if samples % tc.mini_batch_size:
            raise ValueError(f"train.mini_batch_size={tc.mini_batch_size} must divide the global batch "
                             f"rollout.prompts_per_iter x rollout.group_size = {samples}: an iteration is whole mini-batches")
        if tc.mini_batch_size % tc.micro_batch_size:
            raise ValueError(f"train.micro_batch_size={tc.micro_batch_size} must divide train.mini_batch_size="
                             f"{tc.mini_batch_size}: a mini-batch is whole micro-batches")
        rules = algorithm_rules(self.algorithm.name)
        rules.check(self)
        if tc.max_staleness and self.placement.mode == "colocated":
            raise ValueError(
                f"train.max_staleness={tc.max_staleness} with placement.mode=colocated: one actor worker cannot "
                "generate ahead of its own update; set placement.mode: disaggregated (generator workers), or 0"
            )
        if rules.offline and self.reward.models:
            raise ValueError(f"algorithm.name={self.algorithm.name} trains on offline pairs and scores nothing: "
                             "set reward.models: []")
        if self.model.continue_from != "base" and not self.registry.model_name:
            raise ValueError(f"model.continue_from={self.model.continue_from} starts from the MLflow Model Registry: "
                             "set registry.model_name to the registered model")
        self._check_generation()
        self._check_dp()
        self._check_engine()
        self._check_tools()
        self._check_lora()
        check_router_replay(self)
        if self.data.source == "file" and not self.data.train_path:
            raise ValueError("data.source is 'file' but data.train_path is not set: give a JSONL or Parquet path")
        return self

    def _check_generation(self) -> None:
        """What needs on-line generation (an algorithm that samples) or generator workers."""
        recipe, tc = algorithm_rules(self.algorithm.name), self.train
        offline = f"algorithm.name={self.algorithm.name} trains on offline pairs"
        if self.placement.mode == "disaggregated" and (recipe.offline or recipe.samples_in_rounds(self)):
            why = offline if recipe.offline else f"algorithm.name={self.algorithm.name} samples in rounds (dynamic sampling)"
            raise ValueError(f"placement.mode=disaggregated generates ahead of the update, but {why}: run it colocated")
        mode = tc.rollout_correction.mode
        if tc.old_log_prob == "rollout" and (recipe.offline or mode is not None):
            raise ValueError(
                "train.old_log_prob=rollout takes the generation engine's log-probs as old_log_prob: it needs on-line "
                f"generation ({offline})" if recipe.offline else
                f"train.old_log_prob=rollout makes train.rollout_correction.mode={mode}'s ratios 1 (the behaviour "
                "log-probs are the rollout's): set train.rollout_correction.mode: null"
            )
        if mode is not None and recipe.offline:
            raise ValueError(f"train.rollout_correction.mode={mode} weights generated tokens, but {offline}: "
                             "set train.rollout_correction.mode: null")
        if self.rollout.partial.token_budget is not None and self.placement.mode != "disaggregated":
            raise ValueError("rollout.partial.token_budget parks unfinished groups in the generator workers: it needs "
                             "placement.mode: disaggregated")

    def _check_tools(self) -> None:
        """Multi-turn tool rollouts run on the HF engine (a turn of every trajectory at a time) and on vLLM (each
        trajectory at its own pace); docs/agents.md."""
        if not self.tools.enabled:
            if self.sft.demonstrations:
                raise ValueError("sft.demonstrations teach tool use, but no tools are configured: set "
                                 "tools.functions (or tools.environment), or sft.demonstrations: null")
            return
        refused = {
            "data.chat_template is false (tools are rendered by the chat template; set data.chat_template: true)":
                not self.data.chat_template,
            "engine.backend=cost_model (it models time, not tokens; set engine.backend: hf or vllm)":
                self.engine.backend == "cost_model",
            f"algorithm.name={self.algorithm.name} trains on offline pairs (nothing is generated)":
                self.offline,
        }
        for why, bad in refused.items():
            if bad:
                raise ValueError(f"tools are configured but {why}")
        if self.tools.max_total_tokens <= self.rollout.max_new_tokens:
            raise ValueError(
                f"tools.max_total_tokens={self.tools.max_total_tokens} must exceed rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens}: a trajectory's prompt gets the difference, its response the latter"
            )

    def _check_dp(self) -> None:
        tc = self.train
        self._check_megatron()
        if tc.actor_ranks == 1:
            return
        layout = f"train.dp={tc.dp}" if tc.engine == "fsdp" else f"train.engine=megatron (tp={tc.tp}, pp={tc.pp}, dp={tc.dp})"
        refused = {
            "placement.mode=disaggregated": self.placement.mode == "disaggregated",
            f"algorithm.name={self.algorithm.name} (offline pairs)": self.offline,
            "engine.backend=cost_model": self.engine.backend == "cost_model",
            "engine.backend=vllm": tc.engine == "megatron" and self.engine.backend == "vllm",
        }
        for setting, hit in refused.items():
            if hit:
                raise ValueError(f"{layout} is supported with colocated on-line RL on the hf engine, not with {setting}")
        if tc.mini_batch_size % tc.dp:
            raise ValueError(f"train.dp={tc.dp} must divide train.mini_batch_size={tc.mini_batch_size}: every rank "
                             "takes an equal share of each mini-batch")
        if self.rollout.prompts_per_iter < tc.actor_ranks:
            raise ValueError(f"{layout}: its {tc.actor_ranks} actor ranks each generate for some prompts: "
                             "rollout.prompts_per_iter must be >= it")

    def _check_megatron(self) -> None:
        """train.tp / train.pp only with the megatron engine; train.ep and the MoE settings (``moe.py``)."""
        tc = self.train
        if tc.max_tokens_per_micro_batch is not None and self.offline:
            raise ValueError(f"train.max_tokens_per_micro_batch is not supported with algorithm.name="
                             f"{self.algorithm.name} yet: set it to null and size train.micro_batch_size instead")
        if tc.engine != "megatron" and (tc.tp > 1 or tc.pp > 1):
            raise ValueError(f"train.tp={tc.tp} / train.pp={tc.pp} split the model with megatron: set "
                             "train.engine=megatron (fsdp parallelises by train.dp only)")
        check_moe(self)

    def _check_lora(self) -> None:
        """Where LoRA runs: the torch and FSDP2 engines, HF and vLLM generation (vLLM takes the adapter alone at each
        sync: ``dockflow.engines.vllm_lora``); the model-dependent checks, target names and ranks, come where the
        model is built (``dockflow.engines.lora``)."""
        if self.model.lora is None:
            return
        if self.train.engine == "megatron":
            raise ValueError("model.lora with train.engine=megatron is not supported yet: set train.engine: fsdp "
                             "(train.dp >= 2 shards with FSDP2), or model.lora: null")
        if self.engine.backend not in ("hf", "vllm"):
            raise ValueError(f"model.lora with engine.backend={self.engine.backend} is not supported (HF and vLLM "
                             "generation take the adapter): set engine.backend: hf or vllm, or model.lora: null")

    def _check_engine(self) -> None:
        """engine.backend against engine.device, and what vLLM's log-probs can stand for."""
        eng = self.engine
        if eng.backend == "vllm":
            self._check_vllm()
        if self.reward.model_devices > 0 and eng.device == "cpu":
            raise ValueError(f"reward.model_devices={self.reward.model_devices:g} needs engine.device=cuda or npu "
                             "(the reward models score on the run's accelerator kind); set it to 0 to score on CPU")
        if eng.backend == "cost_model" and eng.device != "cpu":
            raise ValueError(f"engine.backend=cost_model models CPU time and computes nothing: set engine.device=cpu "
                             f"(got {eng.device})")

    def _check_vllm(self) -> None:
        """What vLLM's rollout log-probs can stand for, and what its CPU build lacks."""
        eng, vc = self.engine, self.engine.vllm
        if self.rollout.top_p < 1.0:
            raise ValueError(
                f"engine.backend=vllm with rollout.top_p={self.rollout.top_p}: vLLM's log-probs are of the top-p "
                "renormalised distribution, the trainer's of the full vocabulary (logits / temperature), so every "
                "rollout log-prob (old_log_prob=rollout, rollout_correction, the drift metric) would differ by log(kept mass); "
                "set rollout.top_p: 1.0"
            )
        if eng.device == "npu" and self.rollout.temperature != 1.0:
            raise ValueError(
                f"engine.backend=vllm on npu with rollout.temperature={self.rollout.temperature}: vLLM-Ascend's sampler "
                "returns raw log-probs (temperature 1) whatever logprobs_mode says, so the rollout log-probs would "
                "not be the trainer's; set rollout.temperature: 1.0"
            )
        if eng.device == "cpu" and vc.sleep_level:
            raise ValueError(f"engine.vllm.sleep_level={vc.sleep_level} on cpu: vLLM's CPU backend has no sleep mode; "
                             "set engine.vllm.sleep_level: 0 (or null)")
        if eng.device == "cpu" and vc.tensor_parallel_size > 1:
            raise ValueError(f"engine.vllm.tensor_parallel_size={vc.tensor_parallel_size} on cpu: a worker's vLLM "
                             "runs on the cores Ray gave it; set it to 1 (tensor parallelism needs cuda or npu)")

    @property
    def global_batch(self) -> int:
        """G x N: samples per iteration."""
        return self.rollout.prompts_per_iter * self.rollout.group_size

    @property
    def offline(self) -> bool:
        """The algorithm trains on a dataset's preference pairs (no rollouts, no reward worker)."""
        return algorithm_rules(self.algorithm.name).offline

    def flat(self) -> dict[str, Any]:
        """The config as ``{"section.key": value}``, for MLflow params."""
        return flatten_dict(self.model_dump())


def _valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of ``model``; a union of sections, or the algorithm's section (every registered one),
    contributes every member's keys."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        ann = field.annotation
        members = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
        if members == (AlgorithmSection,) or typing.get_args(ann)[:1] == (AlgorithmSection,):
            members = tuple(section_classes())
        for member in members:
            if isinstance(member, type) and issubclass(member, BaseModel):
                keys.extend(k for k in _valid_keys(member, f"{prefix}{name}.") if k not in keys)
    return keys


def _nearest(key: str) -> str:
    valid = _valid_keys(Config)
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.0)
    return match[0] if match else "?"


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = d
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override '{dotted}': '{p}' is not a section")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[x, y]"]`` -> nested dict; values are parsed as YAML scalars/lists."""
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form section.key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"override '{item}': the value is not valid YAML ({yaml_problem(exc)})") from None
        _set_dotted(out, key.strip(), value)
    return out


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one phrase: where (1-based line and column: the construct it was reading,
    else where it gave up) and what."""
    mark = getattr(exc, "context_mark", None) or getattr(exc, "problem_mark", None)
    what = " ".join(str(getattr(exc, "problem", None) or exc).split())
    if getattr(exc, "context", None):
        what += f" ({exc.context})"
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Validate a nested dict; errors name the dotted key and the nearest valid key (a replaced key: what to
    write instead)."""
    renamed = renamed_key(raw)
    if renamed:
        raise ConfigError(renamed)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "unknown_algorithm":
            name = (raw.get("algorithm") or {}).get("name")
            raise ConfigError(f"unknown algorithm.name {name!r}: one of {algorithm_names()}") from None
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"unknown config key '{key}' (did you mean '{_nearest(key)}'?)") from None
        if not key:
            raise ConfigError(f"invalid config: {err['msg']}") from None
        raise ConfigError(f"invalid value for '{key}': {err['msg']} (got {err.get('input')!r})") from None


def _switch_algorithm(raw: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """An override that picks another algorithm than the file's: the file's ``algorithm:`` keys the new
    algorithm's section does not have are left behind (they were written for the other one); the overrides'
    own keys are all kept, so a wrong one still fails."""
    name = (extra.get("algorithm") or {}).get("name")
    written = raw.get("algorithm") or {}
    if name is None or name == written.get("name") or name not in algorithm_names():
        return raw
    fields = algorithm_rules(name).section.model_fields
    return {**raw, "algorithm": {k: v for k, v in written.items() if k in fields}}


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or start from defaults when ``path`` is None) and apply dotted overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file '{p}' not found: pass a YAML file such as configs/grpo_arith.yaml")
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file '{p}' is not valid YAML at {yaml_problem(exc)}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file '{p}' must hold a mapping of sections, not {type(raw).__name__}")
    extra = parse_overrides(overrides or [])
    return config_from_dict(_merge(_switch_algorithm(raw, extra), extra))
