"""The ``reward:`` section: the run's reward functions (TRL's signature), reward models and their limits.

    reward:
      functions:
        - name: math_verify              # a built-in (dockflow.rewards.builtins)
          weight: 1.0
        - path: my_rewards:brevity       # any importable module:function
          weight: 0.1
          isolate: true                  # the default for a path: its own process, killed at reward.timeout_s
      models:
        - path: s3://models/my-rm        # AutoModelForSequenceClassification, 1 label
          weight: 0.5

The combined reward of a sample is the weighted sum of what applies to it (``docs/rewards.md``).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from dockflow.config.base import Section


class RewardFunctionConfig(Section):
    """One reward function: a built-in by ``name``, or a user function by import ``path``."""

    name: str | None = Field(
        None,
        description="A built-in reward (math_verify, code_tests, reasoning_gym), or with 'path' the name logged as "
        "rewards/<name>/mean (default: the function's own name).",
    )
    path: str | None = Field(
        None,
        description="module:function of a user reward, TRL's signature f(prompts, completions, **kwargs) -> "
        "list[float | None]; the module must be importable where the run starts (e.g. on PYTHONPATH).",
    )
    weight: float = Field(1.0, description="Weight of this function in the combined reward.")
    isolate: bool | None = Field(
        None,
        description="true: call it in the reward worker's child process (killed at reward.timeout_s; a crash stops the "
        "run with one line); false: in the reward worker itself (no process hop per batch; for quick code you trust: "
        "a hang cannot be cut short, a crash takes the worker down); null: built-ins (name) in the worker, "
        "path functions in the child process.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> RewardFunctionConfig:
        if self.name is None and self.path is None:
            raise ValueError("a reward function needs 'name' (a built-in) or 'path' (module:function)")
        if self.path is not None and ":" not in self.path:
            raise ValueError(f"reward function path {self.path!r} must be module:function, e.g. my_rewards:brevity")
        return self

    @property
    def label(self) -> str:
        """The name its metrics are logged under."""
        return self.name or self.path.rsplit(":", 1)[1]

    @property
    def in_worker(self) -> bool:
        """Whether it is called in the reward worker itself rather than in its child process (``isolate``)."""
        return not self.isolate if self.isolate is not None else self.path is None


class RewardModelConfig(Section):
    """One reward model: a Hugging Face sequence classifier with one label, scoring (prompt, response)."""

    path: str = Field(..., description="HF model directory (AutoModelForSequenceClassification, num_labels=1): a "
                      "local path or s3://bucket/prefix.")
    name: str | None = Field(None, description="Name logged as rewards/<name>/mean (default: the directory's name).")
    weight: float = Field(1.0, description="Weight of this model's score in the combined reward.")

    @property
    def label(self) -> str:
        return self.name or self.path.rstrip("/").rsplit("/", 1)[-1]


class RewardConfig(Section):
    functions: list[RewardFunctionConfig] = Field(
        default_factory=lambda: [RewardFunctionConfig(name="math_verify")],
        description="Reward functions combined by weight; None or NaN from a function means 'not applicable' and "
        "is skipped for that sample, as in TRL.",
    )
    models: list[RewardModelConfig] = Field(
        default_factory=list, description="Reward models, scored in their own worker; empty = none."
    )
    timeout_s: float = Field(
        60.0, gt=0.0, description="Seconds one call of a reward function may take on one batch before the run stops."
    )
    model_cpus: float = Field(1.0, ge=0.0, description="CPUs the reward-model worker reserves (with reward.models).")
    model_devices: float = Field(
        0.0, ge=0.0, description="Accelerators of engine.device's kind (GPU or NPU) the reward-model worker reserves; "
        "> 0 scores on that device, 0 on CPU; a fraction shares one device with another worker.",
    )
    model_batch_size: int = Field(64, ge=1, description="(prompt, response) pairs per reward-model forward pass.")

    @model_validator(mode="after")
    def _unique_labels(self) -> RewardConfig:
        labels = [f.label for f in self.functions] + [m.label for m in self.models]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"reward functions and models must have distinct names (logged as rewards/<name>/mean); "
                             f"{dup} appear twice: give one a 'name'")
        if not labels:
            raise ValueError("reward.functions and reward.models are both empty: a run needs at least one reward")
        return self
