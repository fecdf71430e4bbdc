"""A stand-in for Ray's actor semantics, to drive the real stage loops without processes.

Each fake actor runs its calls one at a time in the order they were sent (Ray's guarantee for one caller
and a sequential actor); a call starts once the refs among its arguments are resolved and the actor's own
``ready`` says so (e.g. an update waits for its samples in the dock). A call may be a Python generator:
it then runs one step per turn (one chunk of a generation). ``World.wait`` advances random ready actors,
weighted by their speed, until the awaited refs are done: random relative speeds, same ordering rules.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from typing import Any


class Ref:
    """The pending result of one call."""

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None


class SplitRef(Ref):
    """Element ``k`` of another call's tuple result (Ray's ``num_returns``)."""

    def __init__(self, whole: Ref, k: int) -> None:
        super().__init__()
        self.whole, self.k = whole, k

    @property
    def done(self) -> bool:  # type: ignore[override]
        return self.whole.done

    @done.setter
    def done(self, value: bool) -> None:
        pass

    @property
    def value(self) -> Any:  # type: ignore[override]
        return self.whole.value[self.k] if self.whole.done else None

    @value.setter
    def value(self, v: Any) -> None:
        pass


def resolve(value: Any) -> Any:
    return value.value if isinstance(value, Ref) else value


class FakeActor:
    """Handle whose ``handle.method.remote(*args)`` queues ``impl.method(*args)`` on this actor."""

    def __init__(self, world: World, impl: Any, speed: float = 1.0) -> None:
        self._world, self._impl, self._speed = world, impl, speed
        self._queue: deque[tuple[str, tuple, dict, Ref]] = deque()
        self._running: Iterator | None = None
        world.actors.append(self)

    def __getattr__(self, method: str) -> Any:
        actor = self

        class _Method:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Ref:
                ref = Ref()
                actor._queue.append((method, args, kwargs, ref))
                return ref

            @staticmethod
            def options(num_returns: int = 1) -> Any:
                """``.options(num_returns=k).remote(...)``: k refs, one per element of the call's tuple result."""

                class _Split:
                    @staticmethod
                    def remote(*args: Any) -> tuple[Ref, ...]:
                        whole = _Method.remote(*args)
                        parts = tuple(SplitRef(whole, k) for k in range(num_returns))
                        return parts

                return _Split()

        return _Method()

    def _ready(self) -> bool:
        if not self._queue:
            return False
        if self._running is not None:
            return True
        method, args, kwargs, _ = self._queue[0]
        if any(isinstance(a, Ref) and not a.done for a in (*args, *kwargs.values())):
            return False
        check = getattr(self._impl, "ready_for", None)
        return check is None or check(method, *[resolve(a) for a in args])

    def _step(self) -> None:
        method, args, kwargs, ref = self._queue[0]
        if self._running is None:
            out = getattr(self._impl, method)(*[resolve(a) for a in args], **{k: resolve(v) for k, v in kwargs.items()})
            if not isinstance(out, Iterator):
                self._finish(ref, out)
                return
            self._running = out
        try:
            next(self._running)
        except StopIteration as stop:
            self._running = None
            self._finish(ref, stop.value)

    def _finish(self, ref: Ref, value: Any) -> None:
        self._queue.popleft()
        ref.done, ref.value = True, value


class World:
    """All fake actors; ``wait`` is a drop-in for ``dockflow.flow.waiting.wait_stages``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.actors: list[FakeActor] = []

    def run_until(self, refs: list[Ref]) -> None:
        while not all(r.done for r in refs):
            ready = [a for a in self.actors if a._ready()]
            if not ready:
                raise RuntimeError("deadlock: refs pending and no fake actor can run")
            self.rng.choices(ready, weights=[a._speed for a in ready])[0]._step()

    def wait(self, refs: dict[str, Ref], timeout_s: float = 0.0, iteration: int = 0) -> dict[str, Any]:
        self.run_until(list(refs.values()))
        return {k: r.value for k, r in refs.items()}

    # ``dockflow.flow.stage_loops.Waiter``: the stage loops wait through these.
    def ready(self, refs: list[Ref], timeout_s: float) -> list[Ref]:
        """Run actors until one of ``refs`` is done; the done ones."""
        while not any(r.done for r in refs):
            ready = [a for a in self.actors if a._ready()]
            if not ready:
                raise RuntimeError("deadlock: refs pending and no fake actor can run")
            self.rng.choices(ready, weights=[a._speed for a in ready])[0]._step()
        return [r for r in refs if r.done]

    def get(self, ref: Ref) -> Any:
        return ref.value
