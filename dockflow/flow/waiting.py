"""Wait for named Ray tasks with a deadline; errors say which stage, which iteration, and why."""

from __future__ import annotations

import time
from typing import Any


class StageError(RuntimeError):
    """A stage failed, timed out, or its worker or a dock process died (``worker_died``: a restart may help)."""

    def __init__(self, message: str, worker_died: bool = False):
        super().__init__(message)
        self.worker_died = worker_died


def wait_stages(refs: dict[str, Any], timeout_s: float, iteration: int) -> dict[str, Any]:
    """``{stage: ObjectRef}`` -> ``{stage: result}``; raise StageError naming the stage on failure or timeout."""
    import ray

    by_ref = {r: name for name, r in refs.items()}
    pending = list(refs.values())
    results: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            names = sorted(by_ref[r] for r in pending)
            for r in pending:
                ray.cancel(r, force=False)
            raise StageError(f"iteration {iteration}: stage(s) {names} did not finish within {timeout_s:.0f}s")
        done, pending = ray.wait(pending, num_returns=1, timeout=left)
        for r in done:
            name = by_ref[r]
            try:
                results[name] = ray.get(r)
            except Exception as exc:  # noqa: BLE001 - Ray's errors, translated
                raise stage_error(exc, name, iteration) from None
    return results


def stage_error(exc: BaseException, name: str, iteration: int) -> StageError:
    """The StageError for a failed stage: a dead worker, or a dead dock process under the worker's or the driver's
    dock call (``DockUnavailable``; a restart may help), or the stage's own error."""
    import ray

    from dockflow.dock.errors import DockUnavailable

    if isinstance(exc, ray.exceptions.RayActorError):
        return StageError(f"iteration {iteration}: the worker running stage '{name}' died: {exc}", worker_died=True)
    if isinstance(exc, ray.exceptions.RayTaskError):
        return StageError(f"iteration {iteration}: stage '{name}' failed: {error_message(exc.cause)}",
                          worker_died=isinstance(exc.cause, DockUnavailable))
    if isinstance(exc, StageError):
        return exc
    return StageError(f"iteration {iteration}: stage '{name}' failed: {error_message(exc)}",
                      worker_died=isinstance(exc, DockUnavailable))


def out_of_restarts(error: str, max_restarts: int) -> str:
    """The one line of a run that stops because a worker (or a dock process) died after the run had already
    restarted ``fault_tolerance.max_restarts`` times; ``error``: what died."""
    if _STOPS in error:  # already said (a retried pipeline task asks again)
        return error
    return (f"fault_tolerance.max_restarts={max_restarts}{_STOPS}{' '.join(error.split())}. Its latest "
            "checkpoint stays: rerun with --resume (a pipeline run: resubmit it with the same run_name), or raise "
            "fault_tolerance.max_restarts")


_STOPS = " reached, the run stops: "


def error_message(exc: BaseException) -> str:
    """An error as one line for the user: DockFlow's own errors by their message (written to be read), any other
    by its type and message (``ValueError: boom``), never its repr."""
    text = " ".join(str(exc).split())
    if type(exc).__module__.startswith("dockflow.") and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
