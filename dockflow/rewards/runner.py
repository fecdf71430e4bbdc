"""Reward functions, batch by batch, under ``reward.timeout_s``: in the reward worker itself, or in its child process.

A user's function may hang, and in ways no thread can interrupt (``9**9**9`` holds the interpreter for good),
or kill its process, so by default it runs in a child process started once with the worker: each batch goes down
one pipe to it, and a call past the timeout kills that process and stops the run with one line naming the function
and the batch's samples. The built-ins (DockFlow's own, bounded code) are called in the worker instead: no process
hop, they cost what the function costs; a call that returns past the timeout still stops the run with the same
line. ``in_process`` names the functions called in the worker (``reward.functions[].isolate`` decides it). A function
marked ``@reads_reference`` (the built-ins) gets the batch's reference answers (the column ``answer_key`` names) as
``answer``; every function gets every column under its own name. Either
way a function that raises is tried again sample by sample, so the error names the first sample it fails on, and
what it returns is checked the same way. Async functions are awaited.

    runner = RewardRunner([("math_verify", "dockflow.rewards.builtins:math_verify")], timeout_s=60,
                          in_process={"math_verify"})
    results = runner.score(RewardBatch(prompts, completions, completion_ids, {"answer": answers}, RunState(3, 500)))
    results["math_verify"].values    # one float per completion, NaN where it does not apply
    runner.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from dockflow.rewards.functions import (
    REFERENCE_ARG,
    RewardError,
    checked_output,
    import_function,
    takes_reference,
)


@dataclass(frozen=True)
class RunState:
    """What TRL passes as ``trainer_state`` and reward functions read: the step and the run's length."""

    global_step: int
    max_steps: int


@dataclass
class RewardBatch:
    """One batch of completions and the columns the functions get as keyword arguments."""

    prompts: list[Any]  # strings, or (conversational rows) lists of messages
    completions: list[Any]  # strings, or [{"role": "assistant", "content": text}] (``trl_completions``)
    completion_ids: list[list[int]]
    columns: dict[str, list[Any]]
    state: RunState
    sample_ids: list[int] = field(default_factory=list)  # how messages name the samples (default: 0..n-1)
    environments: list[Any] | None = None  # with an environment_factory: each sample's instance (TRL's environments=)
    answer_key: str = "answer"  # the column of ``columns`` holding the reference answer (data.answer_key)


@dataclass
class FunctionResult:
    values: list[float]  # NaN where the function does not apply
    metrics: dict[str, float]  # what it logged with log_metric (mean per name over the batch's calls)
    seconds: float = 0.0  # the call's own time, where it ran (no process hop)


def _call(fn: Any, batch: RewardBatch, rows: list[int], metrics: dict[str, list[float]]) -> Any:
    kwargs = {k: [v[i] for i in rows] for k, v in batch.columns.items()}
    if takes_reference(fn) and batch.answer_key in kwargs:  # a built-in: the reference answer as 'answer'
        kwargs[REFERENCE_ARG] = kwargs[batch.answer_key]
    kwargs.update(trainer_state=batch.state, log_metric=lambda name, value: metrics[name].append(float(value)))
    if batch.environments is not None:  # as TRL passes them: only when the run has an environment_factory
        kwargs["environments"] = [batch.environments[i] for i in rows]
    out = fn(prompts=[batch.prompts[i] for i in rows], completions=[batch.completions[i] for i in rows],
             completion_ids=[batch.completion_ids[i] for i in rows], **kwargs)
    return asyncio.run(out) if asyncio.iscoroutine(out) else out  # an async function's result is awaited


def _first_failing_sample(fn: Any, batch: RewardBatch) -> tuple[int, BaseException] | None:
    for i in range(len(batch.completions)):
        try:
            _call(fn, batch, [i], defaultdict(list))
        except Exception as exc:  # noqa: BLE001 - we are looking for the user's exception
            return i, exc
    return None


def score_function(label: str, fn: Callable[..., Any], batch: RewardBatch) -> tuple[str, Any]:
    """``fn`` on the whole batch, where it runs (the worker or the child): ``("result", FunctionResult)``, or
    ``("error", message)`` naming the function and the sample."""
    n = len(batch.completions)
    metrics: dict[str, list[float]] = defaultdict(list)
    start = time.perf_counter()
    try:
        out = _call(fn, batch, list(range(n)), metrics)
    except Exception as exc:  # noqa: BLE001 - the user's function raised: find the sample
        found = _first_failing_sample(fn, batch)
        i, err = found if found else (None, exc)
        where = f"on sample {batch.sample_ids[i]}" if i is not None else f"on a batch of {n} samples"
        return "error", f"reward function '{label}' raised {type(err).__name__}: {err} {where}"
    seconds = time.perf_counter() - start
    try:
        values = checked_output(label, out, n)
    except RewardError as exc:
        return "error", _renumber(str(exc), batch.sample_ids)
    return "result", FunctionResult(values, {k: sum(v) / len(v) for k, v in metrics.items()}, seconds)


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the reward worker dies (even mid-call in a stuck function)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere: the child still ends when its pipe closes, unless stuck in the user's code


class _Duplex:
    """Two one-way pipe connections as one (the parent's, or the child's, end)."""

    def __init__(self, reader: Connection, writer: Connection) -> None:
        self.reader, self.writer = reader, writer

    def send(self, obj: Any) -> None:
        self.writer.send(obj)

    def recv(self) -> Any:
        return self.reader.recv()

    def poll(self, timeout: float) -> bool:
        return self.reader.poll(timeout)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


def _serve(conn: _Duplex) -> None:
    """The child's loop: take the parent's sys.path and load the functions, then answer each batch function by
    function."""
    _die_with_parent()
    path, functions = conn.recv()
    sys.path[:] = path
    try:
        loaded = [(label, import_function(path)) for label, path in functions]
    except RewardError as exc:
        conn.send(("error", str(exc)))
        return
    conn.send(("ready", None))
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return
        for label, fn in loaded:
            conn.send(score_function(label, fn, batch))


def _renumber(message: str, sample_ids: list[int]) -> str:
    """'at sample i' (position in the batch) -> the sample's own id."""
    head, sep, tail = message.partition(" at sample ")
    if not sep:
        return message
    pos, colon, rest = tail.partition(":")
    return f"{head}{sep}{sample_ids[int(pos)]}{colon}{rest}" if pos.isdigit() else message


class RewardRunner:
    """The reward functions ``[(label, module:function)]``, called batch by batch: those named in ``in_process`` in
    this process, the others in one child process (started only if there are any)."""

    def __init__(self, functions: list[tuple[str, str]], timeout_s: float, start_timeout_s: float = 120.0,
                 in_process: Collection[str] = ()) -> None:
        self.functions, self.timeout_s, self.start_timeout_s = functions, timeout_s, start_timeout_s
        self.isolated = [(label, path) for label, path in functions if label not in in_process]
        self.local = {label: path for label, path in functions if label in in_process}
        self.loaded: dict[str, Callable[..., Any]] = {}  # the in-process functions, once imported
        self.process: subprocess.Popen | None = None
        self.conn: _Duplex | None = None

    def start(self) -> None:
        """Import the in-process functions, and start the child process with the others (``score`` does it too,
        if it has not been done)."""
        self.loaded = {label: import_function(path) for label, path in self.local.items()}
        if self.isolated:
            self._start_child()

    def _start_child(self) -> None:
        # A fresh interpreter (not fork: the worker's threads and locks; not multiprocessing's spawn: it re-runs the
        # parent's __main__, which in a Ray worker is Ray's own script). It gets the worker's sys.path, so a module
        # Ray shipped to the worker (runtime_env py_modules) imports there too.
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        cmd = [sys.executable, "-m", "dockflow.rewards.runner", str(down_r), str(up_w)]
        self.process = subprocess.Popen(cmd, pass_fds=(down_r, up_w), start_new_session=True)
        os.close(down_r)
        os.close(up_w)
        self.conn = _Duplex(Connection(up_r, writable=False), Connection(down_w, readable=False))
        self.conn.send((list(sys.path), self.isolated))
        kind, message = self._receive(self.start_timeout_s, "loading the reward functions")
        if kind == "error":
            self.close()
            raise RewardError(message)

    def _receive(self, timeout_s: float, what: str, wait_s: float | None = None) -> tuple[str, Any]:
        """The child's next answer within ``wait_s`` (default: ``timeout_s``, the limit the message names)."""
        assert self.conn is not None
        if not self.conn.poll(timeout_s if wait_s is None else wait_s):
            self.close()
            raise RewardError(f"{what} ran past reward.timeout_s={timeout_s:g}s; the reward process was killed. Make "
                              "the function faster (or bound its work), or raise reward.timeout_s")
        try:
            return self.conn.recv()
        except EOFError:
            code = None
            if self.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.process.wait(timeout=5)
            self.close()
            raise RewardError(f"the reward process died (exit code {code}) while {what}") from None

    def score(self, batch: RewardBatch) -> dict[str, FunctionResult]:
        """Every function's values on ``batch``, in the order given; a RewardError (the run stops) on the first that
        misbehaves. The child process scores its functions while the in-process ones run here."""
        if not batch.sample_ids:
            batch.sample_ids = list(range(len(batch.completions)))
        if len(self.loaded) < len(self.local):
            self.loaded = {label: import_function(path) for label, path in self.local.items()}
        if self.isolated:
            if self.process is None or self.process.poll() is not None:
                self._start_child()
            assert self.conn is not None
            self.conn.send(batch)
        sent = time.monotonic()  # the child's first function starts on the batch now
        span = f"on samples {batch.sample_ids[0]}-{batch.sample_ids[-1]}"
        out: dict[str, FunctionResult] = {}
        for label, fn in self.loaded.items():
            out[label] = self._checked(self._score_here(label, fn, batch, span))
        for k, (label, _) in enumerate(self.isolated):
            left = max(0.0, self.timeout_s - (time.monotonic() - sent)) if k == 0 else None  # less the time spent here
            out[label] = self._checked(self._receive(self.timeout_s, f"reward function '{label}' {span}", left))
        return {label: out[label] for label, _ in self.functions}

    def _score_here(self, label: str, fn: Callable[..., Any], batch: RewardBatch, span: str) -> tuple[str, Any]:
        """An in-process call: it cannot be stopped early, so its time is checked when it returns."""
        kind, payload = score_function(label, fn, batch)
        if kind == "result" and payload.seconds > self.timeout_s:
            return "error", (f"reward function '{label}' {span} ran past reward.timeout_s={self.timeout_s:g}s (it "
                             f"returned after {payload.seconds:.1f}s in the reward worker, where it cannot be stopped "
                             "early). Make the function faster, raise reward.timeout_s, or give it 'isolate: true' "
                             "to run it in the reward process, killed at the timeout")
        return kind, payload

    def _checked(self, answer: tuple[str, Any]) -> FunctionResult:
        kind, payload = answer
        if kind == "error":
            self.close()  # the child's later answers to this batch are of no use
            raise RewardError(payload)
        return payload

    def close(self) -> None:
        """Stop the child process (killed: it may be stuck in the user's code)."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # and whatever the user's code started
            self.process.wait(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = None


if __name__ == "__main__":  # the child: python -m dockflow.rewards.runner <read fd> <write fd>
    from dockflow.rewards import runner  # by its name, so what it pickles unpickles as the same classes

    runner._serve(runner._Duplex(Connection(int(sys.argv[1]), writable=False),
                                 Connection(int(sys.argv[2]), readable=False)))
