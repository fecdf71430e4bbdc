"""One multi-turn tool-using rollout as a pure function over a ``generate`` callable and a tokenizer.

    traj = run_trajectory(messages, generate, tokenizer, host, limits)   # limits: a ToolsConfig
    traj.token_ids, traj.mask        # the whole trajectory; mask 1 = a model token, 0 = prompt or tool token

Token boundaries: the ids are built incrementally, never by re-rendering the conversation. The prompt is
rendered once (``apply_chat_template(messages, tools=schemas, add_generation_prompt=True)``); each model turn
appends exactly the ids ``generate`` returned; each round of tool results appends the ids the template puts
between an assistant turn's end-of-turn token and the next assistant header (``tool_suffix_ids``, TRL's
``_get_tool_suffix_ids`` method). Re-rendering would not reproduce the generated ids: a template may render
a turn differently once others follow it (Qwen3 writes an empty ``<think></think>`` into the last assistant turn
only, and drops the reasoning of turns before the last user message; Qwen2.5 re-serializes the call's JSON),
and BPE may merge across a boundary differently than the sampler did: the trained tokens would not be the
sampled ones. A template that is not prefix-preserving (Qwen3's) is swapped for TRL's training version of it
(``loop_template``), as TRL's trainer does.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dockflow.agents.parse import ParsedTurn, parse_tool_calls
from dockflow.agents.tool_host import ToolHost, ToolOutcome, error_text
from dockflow.config.tools import ToolsConfig

Generate = Callable[[list[int], int], Sequence[int]]  # (token ids so far, max new tokens) -> new token ids


@dataclass
class TrajectoryMetrics:
    """Counts of one trajectory (logged per trajectory: turns, tool calls, errors, timeouts, tool-token share)."""

    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    timeouts: int = 0
    model_tokens: int = 0
    tool_tokens: int = 0

    @property
    def tool_token_share(self) -> float:
        """Tool tokens over the tokens after the prompt (model + tool)."""
        total = self.model_tokens + self.tool_tokens
        return self.tool_tokens / total if total else 0.0


@dataclass
class Trajectory:
    """The whole trajectory: ids, per-token mask, the conversation as messages, why it ended, its metrics."""

    token_ids: list[int]
    mask: list[int]
    prompt_length: int
    messages: list[dict[str, Any]]
    finish: str  # "stop" (no tool call), "max_turns", "max_tool_calls", "max_total_tokens"
    metrics: TrajectoryMetrics = field(default_factory=TrajectoryMetrics)
    prompt_messages: int = 0  # how many of ``messages`` are the prompt

    @property
    def completion(self) -> list[dict[str, Any]]:
        """The turns after the prompt, as TRL passes a multi-turn completion to reward functions: each assistant
        turn (its text, and its parsed ``tool_calls``), then its tool messages."""
        return self.messages[self.prompt_messages :]

    @property
    def answer(self) -> str:
        """The text of the last assistant turn (its calls left out): what the task's verifier scores."""
        last = self.completion[-1] if self.completion else {}
        return str(last.get("content") or "") if last.get("role") == "assistant" else ""


def chat_ids(rendered: Any) -> list[int]:
    """Token ids from ``apply_chat_template(tokenize=True)``, whichever container this transformers returns."""
    if hasattr(rendered, "keys"):
        rendered = rendered["input_ids"]
    return list(rendered)


def tool_suffix_ids(
    tokenizer: Any, tool_messages: list[dict[str, Any]], chat_template: str | None = None
) -> list[int]:
    """The ids that follow an assistant turn's end-of-turn token: the tool turns, then the next assistant header.

    Rendered on a dummy conversation (TRL's method): the prefix up to its last EOS, and the same conversation
    with the tool messages and the generation prompt; the suffix is what the second adds to the first.
    """
    call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    render = partial(tokenizer.apply_chat_template, tokenize=True, chat_template=chat_template)
    prefix = chat_ids(render(dummy, add_generation_prompt=False))
    full = chat_ids(render(dummy + tool_messages, add_generation_prompt=True))
    # Templates that render "<eos>\n" after a turn: the model stopped at the EOS, the "\n" is the suffix's.
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[: eos[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError(
            "the chat template renders an assistant turn differently once tool turns follow it (Qwen3's writes an "
            "empty <think></think> only into the last one): pass chat_template=loop_template(tokenizer)"
        )
    return full[len(prefix) :]


def loop_template(tokenizer: Any) -> str | None:
    """The chat template the loop renders with: None (the tokenizer's own) when tool turns can be appended to
    it, else TRL's prefix-preserving training template for it, as TRL's trainer picks when given tools (e.g.
    Qwen3's, which always writes the ``<think></think>`` block); a ValueError naming the fix when there is none."""
    probe = [{"role": "tool", "name": "probe", "content": "x"}]
    try:
        tool_suffix_ids(tokenizer, probe)
        return None
    except ValueError:
        pass
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:
        raise ValueError(
            "this chat template renders earlier assistant turns differently once tool turns follow: install trl "
            "(its training templates fix Qwen3 and others) or set a prefix-preserving template on the tokenizer"
        ) from None
    try:
        template = get_training_chat_template(tokenizer)
    except ValueError as exc:
        raise ValueError(
            f"no prefix-preserving version of this chat template is known ({exc}): set one on the tokenizer"
        ) from None
    tool_suffix_ids(tokenizer, probe, template)  # raises if even TRL's version cannot be appended to
    return template


def _outcomes(host: ToolHost, turn: ParsedTurn) -> list[ToolOutcome]:
    out = [host.call(c.name, c.arguments) for c in turn.calls]
    for bad in turn.malformed:
        out.append(
            ToolOutcome(
                bad.name or "invalid_tool_call", error_text(f"malformed tool call: {bad.reason}"), True
            )
        )
    return out


Step = tuple[list[int], int]  # what a trajectory asks of the sampler: (token ids so far, max new tokens)


def open_trajectory(
    messages: list[dict[str, Any]], tokenizer: Any, host: ToolHost, chat_template: str | None = None
) -> Trajectory:
    """A trajectory with nothing generated yet: the prompt rendered once with the host's tool schemas
    (``apply_chat_template(messages, tools=schemas, add_generation_prompt=True)``), all of it mask 0."""
    messages = list(messages)
    ids = chat_ids(
        tokenizer.apply_chat_template(
            messages, tools=host.schemas() or None, tokenize=True, add_generation_prompt=True,
            chat_template=chat_template,
        )
    )
    return Trajectory(ids, [0] * len(ids), len(ids), messages, "stop", prompt_messages=len(messages))


def trajectory_steps(
    messages: list[dict[str, Any]],
    tokenizer: Any,
    host: ToolHost,
    limits: ToolsConfig,
    *,
    stop_ids: Sequence[int] | None = None,
    chat_template: str | None = None,
    start: Trajectory | None = None,
) -> Generator[Step, Sequence[int], Trajectory]:
    """The loop of ``run_trajectory`` as a generator: it yields each turn's ``(ids, max_new_tokens)``, is sent the
    turn's new ids, and returns the trajectory; so one sampler can drive many trajectories a turn at a time
    (``dockflow.agents.batch_loop``). ``start``: go on with this trajectory (``open_trajectory``, or one parked
    before its next turn: ``dockflow.agents.parking``) instead of rendering ``messages``; it is updated in place,
    so whoever holds it sees every finished turn (the generator waits at a ``yield`` with the trajectory exactly as
    it was before the turn it asks for)."""
    stops = set(stop_ids if stop_ids is not None else [tokenizer.eos_token_id])
    traj = start if start is not None else open_trajectory(messages, tokenizer, host, chat_template)
    ids, messages = traj.token_ids, traj.messages
    m = traj.metrics
    while True:
        budget = limits.max_total_tokens - len(ids)
        if budget <= 0:
            traj.finish = "max_total_tokens"
            break
        new = list((yield list(ids), budget))[:budget]
        m.turns += 1
        ids += new
        traj.mask += [1] * len(new)
        m.model_tokens += len(new)
        turn = parse_tool_calls(tokenizer.decode(new, skip_special_tokens=True))
        messages.append(turn.message())
        if not new or new[-1] not in stops:  # cut off by the token budget: its calls (if any) are not run
            traj.finish = "max_total_tokens"
            break
        wanted = len(turn.calls) + len(turn.malformed)
        if not wanted:
            break
        if m.turns >= limits.max_turns:
            traj.finish = "max_turns"
            break
        if m.tool_calls + wanted > limits.max_tool_calls:
            traj.finish = "max_tool_calls"
            break
        outcomes = _outcomes(host, turn)
        m.tool_calls += wanted
        m.tool_errors += sum(o.error for o in outcomes)
        m.timeouts += sum(o.timed_out for o in outcomes)
        tool_messages = [{"role": "tool", "name": o.name, "content": o.content} for o in outcomes]
        suffix = tool_suffix_ids(tokenizer, tool_messages, chat_template)
        if len(ids) + len(suffix) >= limits.max_total_tokens:  # no room for the results and a reply: end here
            traj.finish = "max_total_tokens"
            break
        ids += suffix
        traj.mask += [0] * len(suffix)
        m.tool_tokens += len(suffix)
        messages += tool_messages
    return traj


def run_trajectory(
    messages: list[dict[str, Any]],
    generate: Generate,
    tokenizer: Any,
    host: ToolHost,
    limits: ToolsConfig,
    *,
    stop_ids: Sequence[int] | None = None,
    chat_template: str | None = None,
) -> Trajectory:
    """Generate, parse, call tools and append their turns until a turn has no tool call or a limit is reached.

    ``messages`` is the prompt (an environment's observation already appended); ``stop_ids`` are the ids a
    finished turn ends with (default: the tokenizer's EOS); a turn cut off before one is not parsed for calls.
    ``chat_template``: ``loop_template(tokenizer)``, computed once by the caller (None: the tokenizer's own).
    """
    steps = trajectory_steps(messages, tokenizer, host, limits, stop_ids=stop_ids, chat_template=chat_template)
    try:
        request = next(steps)
        while True:
            request = steps.send(generate(*request))
    except StopIteration as done:
        return done.value
