"""Reward functions in TRL's convention: resolving them, checking what they return, combining them by weight.

A reward function is ``f(prompts, completions, **kwargs) -> list[float | None]``: one value per completion,
``None`` (or NaN) where it does not apply. ``kwargs`` holds the dataset row's other columns as lists
(the reference answer under the name ``data.answer_key`` gives it, and every extra column), ``completion_ids`` (token ids
without padding), ``trainer_state`` (``global_step``, ``max_steps``) and ``log_metric(name, value)``, as TRL's
``GRPOTrainer`` passes them. A function marked ``@reads_reference`` (the built-ins) also gets the reference answer as
``answer``, whatever the column is called. Prompts and
completions are strings for a standard dataset; for a conversational one (its first prompt a list of messages, TRL's
``is_conversational`` rule) prompts are the rows' message lists and each completion is
``[{"role": "assistant", "content": text}]`` (``trl_completions``), so TRL's own reward functions run unchanged.

    fn = import_function("my_rewards:brevity")   # RewardError naming the path when it cannot be imported
    values = checked_output("brevity", fn(prompts, completions, answer=answers), len(completions))
    completions = trl_completions(prompts, texts)   # texts, or [[{"role": "assistant", "content": t}], ...]
    check_columns(check_functions(cfg.reward), ["solution", "level"], "solution")   # where a run starts
"""

from __future__ import annotations

import inspect
import math
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dockflow.data.messages import is_conversational
from dockflow.user_code import import_user_callable

if TYPE_CHECKING:
    from dockflow.config.reward import RewardConfig, RewardFunctionConfig


class RewardError(RuntimeError):
    """A reward function cannot be loaded, or misbehaved on a batch; the message names it and the sample."""


F = TypeVar("F", bound=Callable[..., Any])
REFERENCE_ARG = "answer"  # the keyword a function marked @reads_reference gets the reference answer under
# what every call passes besides the dataset's columns (``environments`` only with an environment factory)
PASSED = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric")


def reads_reference(fn: F) -> F:
    """Mark ``fn`` as reading the row's reference answer as ``answer``, whatever ``data.answer_key`` calls its
    column (the built-ins); an unmarked function gets every column under its own name only."""
    fn.reads_reference = True  # type: ignore[attr-defined]
    return fn


def takes_reference(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is marked ``@reads_reference``."""
    return getattr(fn, "reads_reference", False) is True


def trl_completions(prompts: Sequence[Any], texts: list[str]) -> list[Any]:
    """The completions as TRL passes them for ``prompts``: message lists when the first prompt is conversational
    (a list whose first item is a dict with a 'role'), else the texts themselves."""
    if prompts and is_conversational(prompts[0]):
        return [[{"role": "assistant", "content": t}] for t in texts]
    return texts


def completion_text(completion: Any) -> str:
    """A completion's text in either format: a string as it is; a list of messages, the content of its last message
    that is not a tool result (a multi-turn completion's final answer; "" when it has none)."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        said = [m for m in completion if m.get("role") != "tool"]
        return str(said[-1].get("content") or "") if said else ""
    return str(completion)


def function_path(fn: RewardFunctionConfig) -> str:
    """``module:function`` of a config entry: its ``path``, or the built-in its ``name`` stands for."""
    from dockflow.rewards.builtins import BUILTINS

    if fn.path is not None:
        return fn.path
    if fn.name not in BUILTINS:
        raise RewardError(f"reward function name {fn.name!r} is not a built-in ({', '.join(sorted(BUILTINS))}): "
                          "give 'path: module:function' for your own function")
    return BUILTINS[fn.name]


def import_function(path: str) -> Callable[..., Any]:
    """The callable at ``module:function``; a RewardError with the reason when it cannot be imported."""
    return import_user_callable(path, "reward function", RewardError)


def required_columns(fn: Callable[..., Any], environments: bool = False) -> list[str]:
    """The keyword columns ``fn`` cannot be called without: its parameters without a default that no call passes
    otherwise (``PASSED``; ``environments`` with an environment factory; ``answer`` when it reads the reference)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature (C code): nothing to check
        return []
    given = {*PASSED, *(["environments"] if environments else []), *([REFERENCE_ARG] if takes_reference(fn) else [])}
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in named and p.default is p.empty and p.name not in given]


def check_functions(reward: RewardConfig, environments: bool = False) -> dict[str, list[str]]:
    """Import every configured function now (both drivers call it where a run starts, before any worker starts);
    returns, by label, the dataset columns each one requires (``required_columns``), for ``check_columns``."""
    out = {}
    for fn in reward.functions:
        loaded = import_function(function_path(fn))
        out[fn.label] = required_columns(loaded, environments)
    return out


def check_columns(required: dict[str, list[str]], columns: Sequence[str], answer_key: str) -> None:
    """A RewardError naming the first function that requires a column the dataset's rows lack (``columns``: what
    the reward worker passes, ``dockflow.data.columns_of``), and what to set."""
    for label, names in required.items():
        for name in names:
            if name not in columns:
                raise RewardError(
                    f"reward function '{label}' requires the column '{name}', which the train rows lack (their columns: "
                    f"{', '.join(columns) or 'none'}; the reference answer is data.answer_key={answer_key!r}): set "
                    "data.answer_key to the column that holds the reference answer, add the column to the data, or "
                    "give the parameter a default")


def shipped_modules(reward: RewardConfig) -> list[str]:
    """Files or package directories of the user's reward modules that Ray must ship to its workers (its
    ``runtime_env`` ``py_modules``): the top-level module of each ``path``, unless it is installed (site-packages)
    or part of DockFlow."""
    return user_module_dirs([function_path(fn) for fn in reward.functions])


def user_module_dirs(paths: Sequence[str]) -> list[str]:
    """The top-level module file or package directory of each ``module:attribute`` path that Ray must ship
    (neither installed nor DockFlow's): reward functions, and the run's tools (``tools.functions``, its
    environments)."""
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    out: list[str] = []
    for path in paths:
        top = path.partition(":")[0].split(".")[0]
        if top == "dockflow":
            continue
        import_function(path)
        module = sys.modules[top]
        where = Path(module.__path__[0]) if hasattr(module, "__path__") else Path(module.__file__ or "")
        if where.suffix or where.is_dir():
            if not any(str(where).startswith(p) for p in installed) and str(where) not in out:
                out.append(str(where))
    return out


def checked_output(label: str, out: Any, n: int) -> list[float]:
    """``out`` as n floats (None and NaN -> NaN); a RewardError naming the function and the sample otherwise."""
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):  # numpy arrays, torch tensors
        out = out.tolist()
    if not isinstance(out, Sequence) or isinstance(out, (str, bytes)):
        raise RewardError(f"reward function '{label}' returned {type(out).__name__}, not a list of {n} numbers")
    if len(out) != n:
        raise RewardError(f"reward function '{label}' returned {len(out)} values for {n} completions: return one "
                          "value (or None) per completion")
    values: list[float] = []
    for i, v in enumerate(out):
        if v is None:
            values.append(math.nan)
            continue
        if hasattr(v, "item") and not isinstance(v, (int, float)):
            v = v.item()  # numpy / torch scalars
        if not isinstance(v, (int, float)):
            raise RewardError(f"reward function '{label}' returned {type(v).__name__} {v!r} at sample {i}: "
                              "return a number, or None where it does not apply")
        if math.isinf(v):
            raise RewardError(f"reward function '{label}' returned {v} at sample {i}: rewards must be finite")
        values.append(float(v))
    return values


def combine(per_function: Sequence[Sequence[float]], weights: Sequence[float]) -> list[float]:
    """Weighted sum per sample over the functions that apply to it (NaN skipped, as TRL's ``nansum``). A sample
    no function applies to stays NaN (unscorable): the estimators leave it out of every baseline and give it
    advantage 0, as TRL's GRPOTrainer does."""
    n = len(per_function[0]) if per_function else 0
    out = []
    for i in range(n):
        applied = [w * col[i] for col, w in zip(per_function, weights, strict=True) if not math.isnan(col[i])]
        out.append(sum(applied) if applied else math.nan)
    return out
