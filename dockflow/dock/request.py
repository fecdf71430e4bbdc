"""What a consumer asks the dock for: one frozen request, checked in the client and passed whole.

    request = DockRequest("actor_update", batch_size=64, window=plan.dock_window(i), whole_groups=True)
    batch = dock.get(request)
    for batch in consume(dock, request, total=256): ...          # workers: the share of one iteration

Light (no torch): the dock's actors receive it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class DockRequest:
    """A get: ``batch_size`` samples for ``consumer`` whose ``columns`` are ready (None: the consumer's registered
    columns), the lowest first. ``whole_groups``: complete GRPO groups only. ``window=(lo, hi)``: only indices
    of that slice (the iteration that owns it). ``dp_share=(rank, ranks)``: this rank's length-balanced share of
    a mini-batch of ``ranks x batch_size`` (``TransferDock.get``). ``timeout_s``: None = the dock's default."""

    consumer: str
    batch_size: int
    columns: tuple[str, ...] | None = None
    whole_groups: bool = False
    window: tuple[int, int] | None = None
    dp_share: tuple[int, int] | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.columns is not None and not isinstance(self.columns, tuple):
            object.__setattr__(self, "columns", tuple(self.columns))
        for name in ("window", "dp_share"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    def sized(self, batch_size: int) -> DockRequest:
        """The same request for another number of samples (a worker's last, smaller batch)."""
        return replace(self, batch_size=batch_size)

    def resolved(self, columns: Sequence[str], window: tuple[int, int] | None, timeout_s: float) -> DockRequest:
        """What the client sends on: the columns, window and timeout it checked and filled in."""
        return replace(self, columns=tuple(columns), window=window, timeout_s=timeout_s)
