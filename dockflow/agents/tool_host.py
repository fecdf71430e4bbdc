"""Tools in TRL's convention and the child process that calls them under a timeout.

A tool is a plain function with type hints and a docstring; its JSON schema is
``transformers.utils.get_json_schema`` (what ``apply_chat_template(tools=...)`` renders). Config lists them by
``module:function`` (``tools.functions``), as reward functions are listed::

    fns = [import_tool(p) for p in cfg.functions]
    with ToolHost(fns, timeout_s=cfg.timeout_s) as host:        # or ToolHost(fns, factory=Calculator, ...)
        out = host.call("add", {"a": 3, "b": 4})                  # ToolOutcome(content="7", ...)

Every call runs in the host's child process (forked, so the functions and the environment factory need not be
picklable). A call still running at ``timeout_s`` is killed with the child (SIGKILL): a thread could only be
abandoned, and a hung thread keeps its CPU and locks. The next call starts a fresh child; an environment's
state dies with its child, so later calls on it answer with an error. A tool that raises, a name not in the
list and arguments the function does not take answer with TRL's error turn ``{'error': '<message>'}`` and are
counted as errors; results are ``str(result)`` as in TRL.
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import pickle
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from dockflow.agents.environments import environment_methods
from dockflow.user_code import import_user_callable


class ToolError(RuntimeError):
    """A tool or environment cannot be loaded or described; the message names it and what to do."""


@dataclass(frozen=True)
class ToolOutcome:
    """What one call returned as the tool turn's text, and whether it failed or was killed at the timeout."""

    name: str
    content: str
    error: bool = False
    timed_out: bool = False


def import_tool(path: str) -> Callable[..., Any]:
    """The function (or environment class) at ``module:attribute``; a ToolError naming the path otherwise."""
    return import_user_callable(path, "tool", ToolError, noun="callable")


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a tool, as TRL and ``apply_chat_template`` build it."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 - transformers raises several types for an undescribable function
        raise ToolError(
            f"tool {getattr(fn, '__name__', fn)!r} has no JSON schema ({exc}): give every argument a type "
            "hint and the function a docstring with an Args: section"
        ) from None


def error_text(message: str) -> str:
    """The tool turn TRL writes for a failed call."""
    return str({"error": message})


def _awaited(value: Any) -> Any:
    """The result of an ``async def`` tool (TRL accepts them too), or ``value`` itself."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def _serve(conn: Connection, tools: Sequence[Callable[..., Any]], factory: Callable[[], Any] | None) -> None:
    """The child's loop: ("reset", kwargs) / ("call", name, kwargs) / ("reward",) / ("state",) / ("pickle",) in,
    (ok, value) out; "state" answers the environment instance itself (pickled by the pipe: a copy for the parent),
    "pickle" its pickle's bytes (what a parked rollout keeps: the parent need not unpickle it)."""
    table = {fn.__name__: fn for fn in tools}
    env = None
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        try:
            if env is None and factory is not None:
                env = factory()
                table.update(environment_methods(env))
            op = request[0]
            if op == "reset":
                conn.send((True, None if env is None else _awaited(env.reset(**request[1]))))
            elif op == "reward":
                reward = getattr(env, "get_reward", None)
                conn.send((True, None if reward is None else _awaited(reward())))
            elif op == "state":
                conn.send((True, env))  # pickled before anything is written: a failure sends the error below
            elif op == "pickle":
                conn.send((True, None if env is None else pickle.dumps(env, protocol=pickle.HIGHEST_PROTOCOL)))
            elif request[1] not in table:
                conn.send((False, f"Tool {request[1]} not found."))
            else:
                conn.send((True, str(_awaited(table[request[1]](**request[2])))))
        except Exception as exc:  # noqa: BLE001 - the user's code failed: its message goes back to the model
            conn.send((False, str(exc) or type(exc).__name__))


# One fork at a time (hosts start from the threads of ``stream_loop`` too): a child forked while another host's
# start still holds the ends meant for its own child would inherit them, and that host's child would then not be
# seen to exit (its ``join`` waits out its timeout) nor its pipe to close until the sibling ends too.
_FORKING = threading.Lock()


class ToolHost:
    """A child process holding the tools (and, with ``factory``, one environment instance: one host per rollout).

    ``saved``: the bytes of ``snapshot()`` from an earlier host of the same rollout (a parked rollout resumed):
    the child's environment is that instance, unpickled in the child, instead of a new ``factory()``; ``lost``:
    the earlier host's ``lost`` (a rollout whose environment was already stopped stays so)."""

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]] = (),
        factory: Callable[[], Any] | None = None,
        timeout_s: float = 10.0,
        *,
        saved: bytes | None = None,
        lost: str | None = None,
    ) -> None:
        self.tools, self.factory, self.timeout_s = list(tools), factory, timeout_s
        self._make = partial(pickle.loads, saved) if factory is not None and saved is not None else factory
        self.names = {fn.__name__ for fn in self.tools}
        # A probe instance, as TRL's trainer makes one: its methods are the tools the model is shown.
        probe = factory() if factory is not None else None
        self._probe = environment_methods(probe) if factory is not None else {}
        self.environment = type(probe).__name__ if factory is not None else None  # its rewards' name, as TRL's
        self.names |= set(self._probe)
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self.lost = lost  # why the environment's state is gone (its child was killed or crashed)

    def schemas(self) -> list[dict[str, Any]]:
        """The JSON schema of every tool the model is shown, standalone tools first."""
        return [tool_schema(fn) for fn in [*self.tools, *self._probe.values()]]

    @property
    def pid(self) -> int | None:
        """The child's process id while one runs."""
        return None if self._proc is None else self._proc.pid

    def _start(self) -> Connection:
        if self._conn is None:
            ctx = multiprocessing.get_context("fork")
            with _FORKING:
                parent, child = ctx.Pipe()
                self._proc = ctx.Process(target=_serve, args=(child, self.tools, self._make), daemon=True)
                self._proc.start()
                child.close()
            self._conn = parent
        return self._conn

    def _ask(self, request: tuple) -> tuple[bool, Any, bool]:
        """(ok, value, timed_out) of one request; a child that hangs is killed, one that dies is reported."""
        if self.lost is not None:
            return False, self.lost, False
        conn = self._start()
        what = f"tool {request[1]}" if request[0] == "call" else request[0]
        try:
            conn.send(request)
            if conn.poll(self.timeout_s):
                answer = conn.recv()
                return answer[0], answer[1], False
            why, timed_out = f"timed out after {self.timeout_s:g} s and was killed", True
        except (EOFError, OSError):  # the child died during the call, or before it (a broken pipe)
            self._proc.join(timeout=5.0)
            why, timed_out = f"failed: its process ended (exit code {self._proc.exitcode})", False
        self.close()
        if self.factory is not None:
            self.lost = f"the environment was stopped: an earlier call of {what} {why}"
        return False, f"{what} {why}", timed_out

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutcome:
        """Call tool ``name`` with ``arguments``; failures become TRL's error turn, never an exception."""
        if name not in self.names:
            return ToolOutcome(name, error_text(f"Tool {name} not found."), error=True)
        ok, value, timed_out = self._ask(("call", name, dict(arguments)))
        return ToolOutcome(name, value if ok else error_text(value), error=not ok, timed_out=timed_out)

    def reset(self, row: Mapping[str, Any]) -> Any:
        """The environment's ``reset(**row)`` (its observation, or None); a ToolError when it fails or hangs."""
        ok, value, _ = self._ask(("reset", dict(row)))
        if not ok:
            raise ToolError(
                f"environment {getattr(self.factory, '__name__', self.factory)!r}: reset failed: {value}"
            )
        return value

    def reward(self) -> float | None:
        """The environment's ``get_reward()``; None without one or when its state was lost or it failed."""
        if self.factory is None:
            return None
        ok, value, _ = self._ask(("reward",))
        return value if ok else None

    def state(self) -> Any:
        """A copy of the environment instance as it is now (pickled out of the child), for reward functions'
        ``environments=``; None without an environment or when its state was lost; a ToolError naming the class
        when the instance cannot be pickled."""
        return self._copy("state", "copied to the reward functions (environments=)")

    def snapshot(self) -> bytes | None:
        """The environment instance as it is now, pickled in the child (bytes: ``ToolHost(..., saved=)`` resumes
        it in another child, process or run); None without an environment or when its state was lost; a ToolError
        naming the class when the instance cannot be pickled."""
        return self._copy("pickle", "parked (partial rollout keeps it until the rollout resumes)")

    def _copy(self, op: str, purpose: str) -> Any:
        if self.factory is None or self.lost is not None:
            return None
        ok, value, _ = self._ask((op,))
        if ok:
            return value
        if self.lost is not None:  # the child hung or died while pickling: the state is gone
            return None
        raise ToolError(
            f"environment {getattr(self.factory, '__name__', self.factory)!r} cannot be {purpose}: {value}; make "
            "its instances picklable (e.g. drop open handles in __getstate__)"
        )

    def kill(self) -> None:
        """Send the child SIGKILL without waiting for it (``close`` reaps it); a no-op when none runs."""
        if self._proc is not None:
            self._proc.kill()

    def close(self) -> None:
        """Kill the child (a no-op when none runs)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5.0)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def __enter__(self) -> ToolHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ToolHostPool:
    """Stateless tools (no environment) shared by the trajectories of a call: each call takes an idle
    ``ToolHost`` child, or starts one when every child is busy, so trajectories that run side by side
    (``dockflow.agents.stream_loop``) call their tools in parallel; driven one call at a time it is one child,
    as one ``ToolHost``. The ``ToolHost`` methods a rollout uses: no environment, so no reward and no state."""

    environment: str | None = None
    lost: str | None = None

    def __init__(self, tools: Sequence[Callable[..., Any]], timeout_s: float) -> None:
        self.tools, self.timeout_s = list(tools), timeout_s
        self._shown = ToolHost(self.tools, timeout_s=timeout_s)  # starts no child: its schemas only
        self._idle: list[ToolHost] = []
        self._hosts: list[ToolHost] = []
        self._lock = threading.Lock()

    def schemas(self) -> list[dict[str, Any]]:
        return self._shown.schemas()

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutcome:
        with self._lock:
            if self._idle:
                host = self._idle.pop()
            else:
                host = ToolHost(self.tools, timeout_s=self.timeout_s)
                self._hosts.append(host)
        try:
            return host.call(name, arguments)
        finally:
            with self._lock:
                self._idle.append(host)

    @property
    def children(self) -> int:
        """How many child processes the pool started (its most parallel moment)."""
        return len(self._hosts)

    def reward(self) -> None:
        return None

    def state(self) -> None:
        return None

    def snapshot(self) -> None:
        return None

    def close(self) -> None:
        for host in self._hosts:  # every child signalled first, then each reaped: no join waits on a live one
            host.kill()
        for host in self._hosts:
            host.close()

    def __enter__(self) -> ToolHostPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
