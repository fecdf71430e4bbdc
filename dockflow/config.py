"""Typed run configuration: pydantic models, YAML loading and dotted command-line overrides.

A config is one YAML file (see ``configs/``) whose keys mirror the classes below. Every key that a run
needs is written in the example YAML; the defaults here only fill keys that a user may leave out.
Unknown or mistyped keys are errors that name the key and the nearest valid one::

    cfg = load_config("configs/grpo_arith.yaml", ["train.iterations=10", "rollout.temperature=0.8"])
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key and what to do."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    name: str = Field("dockflow", description="Run name: used for the run directory and the MLflow run.")
    output_dir: str = Field("runs", description="Parent directory of run directories.")
    seed: int = Field(0, description="Seed of every random choice in the run (data order, sampling, init).")


class RayConfig(_Section):
    address: str | None = Field(None, description="Ray cluster to join ('auto', 'ray://host:10001'); null starts a local one.")
    num_cpus: int | None = Field(None, description="CPUs of the local cluster; null = all of this machine's.")
    namespace: str | None = Field(None, description="Ray namespace for the run's actors; null = derived from run.name.")
    actor_cpus: float = Field(2.0, description="CPUs reserved by the actor (policy) worker.")
    reference_cpus: float = Field(1.0, description="CPUs reserved by the reference worker.")
    torch_threads: int = Field(2, description="torch intra-op threads per model worker.")
    init_timeout_s: float = Field(120.0, description="Seconds to wait for workers to start before failing.")


class ArithmeticConfig(_Section):
    digits: int = Field(2, ge=1, le=12, description="Maximum digits of each operand.")
    ops: list[Literal["+", "-"]] = Field(default_factory=lambda: ["+", "-"], description="Operators drawn uniformly.")
    num_train: int = Field(20000, ge=1, description="Prompts in the train split (RL prompts come from here).")
    num_labeled: int = Field(900, ge=0, description="Train prompts whose answers SFT may use (labels are scarce).")
    num_val: int = Field(200, ge=0, description="Labeled validation prompts for SFT early stopping (never the test set).")
    num_test: int = Field(500, ge=1, description="Held-out test prompts for accuracy.")


class DataConfig(_Section):
    source: Literal["arithmetic", "file"] = Field("arithmetic", description="Synthetic arithmetic task, or user files.")
    arithmetic: ArithmeticConfig = Field(default_factory=ArithmeticConfig)
    train_path: str | None = Field(None, description="JSONL/Parquet with 'prompt' and 'answer' (source: file).")
    test_path: str | None = Field(None, description="Held-out JSONL/Parquet (source: file).")
    prompt_template: str = Field("{prompt}\nAnswer: ", description="Template applied to each prompt; '{prompt}' is replaced.")


class TinyModelConfig(_Section):
    hidden_size: int = Field(128, description="Hidden size of the tiny Qwen2 model.")
    num_layers: int = Field(4, description="Transformer layers.")
    num_heads: int = Field(4, description="Attention heads.")
    num_kv_heads: int = Field(2, description="Key/value heads (GQA).")
    intermediate_size: int = Field(512, description="MLP inner size.")
    max_position_embeddings: int = Field(128, description="Longest sequence the model handles.")
    tokenizer_merges: int = Field(
        64, ge=0, description="BPE merges the local tokenizer learns from the train prompts (0 = characters only)."
    )


class ModelConfig(_Section):
    path: str | None = Field(None, description="Local HF model directory; null builds the tiny model below.")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype.")


class SFTConfig(_Section):
    enabled: bool = Field(True, description="Warm-start the policy with SFT on the labeled subset first.")
    lr: float = Field(2e-3, ge=0.0, description="SFT peak learning rate (AdamW, no weight decay).")
    warmup_steps: int = Field(100, ge=0, description="Optimizer steps of linear learning-rate warm-up.")
    batch_size: int = Field(64, ge=1, description="SFT batch size.")
    max_epochs: int = Field(150, ge=0, description="Upper bound on SFT epochs.")
    eval_every_epochs: int = Field(2, ge=1, description="Validate every this many epochs.")
    patience: int = Field(6, ge=1, description="Stop after this many validations without a new best accuracy.")
    cache_dir: str = Field("runs/cache", description="SFT results are cached here, keyed by everything they depend on.")


class AlgorithmConfig(_Section):
    name: Literal["grpo"] = Field("grpo", description="RL algorithm.")
    clip_eps: float = Field(0.2, description="PPO-style ratio clip epsilon.")
    kl_coef: float = Field(0.0, ge=0.0, description="Weight of the KL penalty to the reference policy (0 disables it).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (Schulman's k1/k2/k3).")
    norm_adv_by_std: bool = Field(True, description="Divide group-centred rewards by the group std (GRPO).")
    adv_eps: float = Field(1e-6, description="Added to the std when normalising advantages.")


class RolloutConfig(_Section):
    prompts_per_iter: int = Field(32, ge=1, description="G: prompts per iteration.")
    group_size: int = Field(8, ge=1, description="N: responses per prompt.")
    max_new_tokens: int = Field(8, ge=1, description="Longest response in tokens.")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    batch_size: int = Field(256, ge=1, description="Sequences generated per forward batch.")


class TrainConfig(_Section):
    iterations: int = Field(500, ge=0, description="RL iterations.")
    lr: float = Field(2e-4, gt=0.0, description="Policy learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    epochs: int = Field(1, ge=1, description="Update epochs over each iteration's batch.")
    mini_batch_size: int = Field(256, ge=1, description="Samples per optimizer step.")
    micro_batch_size: int = Field(256, ge=1, description="Samples per forward/backward (gradient accumulation).")
    grad_clip: float = Field(1.0, gt=0.0, description="Max global gradient norm.")
    infer_batch_size: int = Field(256, ge=1, description="Samples per forward in log-prob inference.")
    stage_timeout_s: float = Field(1800.0, gt=0.0, description="Seconds one stage may take before the run fails.")


class DockConfig(_Section):
    backend: Literal["distributed", "centralized"] = Field("distributed", description="Transfer dock backend.")
    num_warehouses: int | None = Field(None, ge=1, description="Warehouse actors; null = one per Ray node.")
    get_timeout_s: float = Field(300.0, gt=0.0, description="Seconds a get waits for ready samples before failing.")


class EvalConfig(_Section):
    every: int = Field(100, ge=0, description="Held-out accuracy every this many iterations (0 = only first and last).")
    num_prompts: int = Field(500, ge=1, description="Held-out prompts per evaluation.")
    batch_size: int = Field(500, ge=1, description="Prompts per greedy generation batch.")


class CheckpointConfig(_Section):
    every: int = Field(100, ge=0, description="Checkpoint every this many iterations (0 = only at the end).")
    dir: str | None = Field(None, description="Checkpoint directory; null = <run dir>/checkpoints.")
    keep: int = Field(2, ge=1, description="Keep the last K checkpoints.")


class TrackingConfig(_Section):
    uri: str | None = Field(None, description="MLflow tracking URI; null = a local store in the run directory.")
    experiment: str = Field("dockflow", description="MLflow experiment name.")


class Config(_Section):
    """The whole run: one section per subsystem."""

    run: RunConfig = Field(default_factory=RunConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    dock: DockConfig = Field(default_factory=DockConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _check_batches(self) -> Config:
        samples = self.rollout.prompts_per_iter * self.rollout.group_size
        if samples % self.train.mini_batch_size:
            raise ValueError(
                f"train.mini_batch_size={self.train.mini_batch_size} must divide the global batch "
                f"rollout.prompts_per_iter x rollout.group_size = {samples}"
            )
        if self.train.mini_batch_size % self.train.micro_batch_size:
            raise ValueError(
                f"train.micro_batch_size={self.train.micro_batch_size} must divide "
                f"train.mini_batch_size={self.train.mini_batch_size}"
            )
        if self.data.source == "file" and not self.data.train_path:
            raise ValueError("data.source is 'file' but data.train_path is not set: give a JSONL or Parquet path")
        return self

    @property
    def global_batch(self) -> int:
        """G x N: samples per iteration."""
        return self.rollout.prompts_per_iter * self.rollout.group_size

    def flat(self) -> dict[str, Any]:
        """The config as ``{"section.key": value}``, for MLflow params."""
        return flatten_dict(self.model_dump())


def flatten_dict(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> ``{"a.b.c": value}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_dict(v, key + "."))
        else:
            out[key] = v
    return out


def _valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_valid_keys(ann, f"{prefix}{name}."))
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
        _set_dotted(out, key.strip(), yaml.safe_load(raw) if raw.strip() else None)
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Validate a nested dict; errors name the dotted key and the nearest valid key."""
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"unknown config key '{key}' (did you mean '{_nearest(key)}'?)") from None
        if not key:
            raise ConfigError(f"invalid config: {err['msg']}") from None
        raise ConfigError(f"invalid value for '{key}': {err['msg']} (got {err.get('input')!r})") from None


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
            raise ConfigError(f"config file '{p}' is not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file '{p}' must hold a mapping of sections, not {type(raw).__name__}")
    return config_from_dict(_merge(raw, parse_overrides(overrides or [])))
