"""The ``tools:`` section: the tools a policy may call over several turns and the limits of one trajectory.

    tools:
      functions: [my_tools:add, my_tools:search]    # module:function, TRL's tools= convention
      environment: my_envs:Calculator               # or environments: {calc: my_envs:Calculator, ...}
      max_turns: 4
      max_tool_calls: 8
      max_total_tokens: 1024
      timeout_s: 5.0
      record_bytes: 16384

``Config.tools``; with functions or an environment set, the HF generation engine runs the tool loop
(``dockflow.rollout.multi_turn``) instead of one response per prompt (docs/agents.md).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from dockflow.config.base import Section


def _check_path(kind: str, path: str) -> None:
    if ":" not in path:
        raise ValueError(f"{kind} path {path!r} must be module:attribute, e.g. my_tools:add")


class ToolsConfig(Section):
    functions: list[str] = Field(
        default_factory=list,
        description="module:function of each tool: a plain function with type hints and a "
        "docstring (its JSON schema from transformers.utils.get_json_schema), as TRL's GRPOTrainer(tools=...).",
    )
    environment: str | None = Field(
        None,
        description="module:Class of TRL's environment_factory: one instance per rollout, its public methods are "
        "tools, reset(**row) may return text appended to the last user message, get_reward() optional.",
    )
    environments: dict[str, str] = Field(
        default_factory=dict,
        description="Named environment factories (module:Class); each row's 'environment' column "
        "picks one, as TRL's dict environment_factory.",
    )
    max_turns: int = Field(
        4, ge=1, description="Model turns per trajectory; a tool call in the last turn is not run."
    )
    max_tool_calls: int = Field(
        8,
        ge=0,
        description="Tool calls per trajectory; a turn whose calls would pass it ends "
        "the trajectory without running them.",
    )
    max_total_tokens: int = Field(
        1024, ge=1, description="Prompt, model and tool tokens of one trajectory together."
    )
    timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="Seconds one tool call (or reset/get_reward) may take; a call "
        "still running then is killed with its child process and answered with an error turn.",
    )
    record_bytes: int = Field(
        16384,
        ge=64,
        description="Bytes per trajectory of its record in the dock (tool_record): the conversation and a copy "
        "of the environment, which reward functions get as completions and environments=; a record that does "
        "not fit stops the run with both sizes.",
    )

    @property
    def enabled(self) -> bool:
        """Whether a run gives the policy tools (functions or an environment)."""
        return bool(self.functions or self.environment or self.environments)

    @property
    def has_environment(self) -> bool:
        """Whether rollouts run in environments (TRL's environment_factory): reward functions then get
        ``environments=``."""
        return bool(self.environment or self.environments)

    @property
    def paths(self) -> list[str]:
        """Every module:attribute the section names (tools, then environments): imported where the run starts,
        their modules shipped to the workers."""
        return [*self.functions, *([self.environment] if self.environment else []), *self.environments.values()]

    @model_validator(mode="after")
    def _paths(self) -> ToolsConfig:
        for path in self.functions:
            _check_path("tool", path)
        for path in [*([self.environment] if self.environment else []), *self.environments.values()]:
            _check_path("environment", path)
        if self.environment and self.environments:
            raise ValueError(
                "give tools.environment (one factory) or tools.environments (named factories), not both"
            )
        return self
