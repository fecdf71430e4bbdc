"""The data section: the task (synthetic arithmetic, a reasoning-gym task, or the user's files), its columns, how
prompts are templated, and the length policy for prompts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from dockflow.config.base import Section


class ArithmeticConfig(Section):
    digits: int = Field(2, ge=1, le=12, description="Maximum digits of each operand.")
    ops: list[Literal["+", "-"]] = Field(default_factory=lambda: ["+", "-"], description="Operators drawn uniformly.")
    num_train: int = Field(20000, ge=1, description="Prompts in the train split (RL prompts come from here).")
    num_labeled: int = Field(900, ge=0, description="Train prompts whose answers SFT may use (labels are scarce).")
    num_val: int = Field(200, ge=0, description="Labeled validation prompts for SFT early stopping (never the test set).")
    num_test: int = Field(500, ge=1, description="Held-out test prompts for accuracy.")


def _countdown_options() -> dict[str, Any]:
    return {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 50, "min_target": 1, "max_target": 100,
            "operators": ["+", "-"], "shuffle": False}


class ReasoningGymConfig(Section):
    name: str = Field("countdown", description="reasoning-gym task (reasoning_gym.create_dataset name, e.g. countdown).")
    options: dict[str, Any] = Field(
        default_factory=_countdown_options,
        description="The generator's own config, passed through to create_dataset (countdown: min/max_numbers, "
        "min/max_value, min/max_target, operators).",
    )
    short_prompt: bool = Field(
        True,
        description="DockFlow's compact prompt for tasks that have one (countdown: 'Make 24 from 2 3 4.'), for a "
        "tiny model's short context; false: reasoning-gym's own question text.",
    )
    num_train: int = Field(10000, ge=1, description="Prompts in the train split (RL prompts come from here).")
    num_labeled: int = Field(500, ge=0, description="Train prompts whose reference solutions SFT may use.")
    num_val: int = Field(200, ge=0, description="Labeled validation prompts for SFT early stopping (never the test set).")
    num_test: int = Field(500, ge=1, description="Held-out test prompts for accuracy.")


class DataConfig(Section):
    source: Literal["arithmetic", "file", "reasoning_gym"] = Field(
        "arithmetic", description="Synthetic arithmetic task, user files, or a reasoning-gym task (data.reasoning_gym)."
    )
    arithmetic: ArithmeticConfig = Field(default_factory=ArithmeticConfig)
    reasoning_gym: ReasoningGymConfig = Field(
        default_factory=ReasoningGymConfig, description="The reasoning-gym task (source: reasoning_gym)."
    )
    train_path: str | None = Field(
        None, description="JSONL/Parquet with 'prompt' and 'answer' (source: file): a local path, or s3://bucket/key."
    )
    test_path: str | None = Field(None, description="Held-out JSONL/Parquet (source: file): a local path, or s3://bucket/key.")
    shuffle_seed: int | None = Field(
        None,
        description="Seed of the order in which RL draws train prompts; null = run.seed, or for a run that continues "
        "from a registered model one derived from run.name (each recurring run draws another order). The dataset "
        "itself (splits, held-out set) always follows run.seed, so every run is scored on the same test set.",
    )
    prompt_template: str = Field("{prompt}\nAnswer: ", description="Template applied to each prompt; '{prompt}' is replaced.")
    prompt_key: str | None = Field(
        None, description="Dataset column holding the prompt (source: file); null = 'prompt', else 'problem'."
    )
    answer_key: str = Field("answer", description="Dataset column holding the reference answer (source: file).")
    chat_template: bool = Field(
        False,
        description="Format each templated prompt as a user turn with the tokenizer's own chat template "
        "(apply_chat_template, generation prompt added), for instruct models.",
    )
    system_prompt: str | None = Field(None, description="System turn before the prompt (with chat_template only).")
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="Longest templated train prompt in tokens (see overlong_prompts). null = no limit. The longest "
        "prompt kept + rollout.max_new_tokens is checked against the model's context either way.",
    )
    overlong_prompts: Literal["refuse", "filter"] = Field(
        "refuse",
        description="A train prompt over max_prompt_tokens: 'refuse' stops the run as it starts, naming the first; "
        "'filter' leaves such prompts out of the prompt order and logs their count (verl's "
        "data.filter_overlong_prompts).",
    )
