"""One page-locked host buffer that every swap-out of an engine reuses (``HostSwap.swap_out(..., arena=...)``).

Pinning host memory is slow: the driver locks every page. Measured on an H200 machine
(``benchmarks/reshard_device.py``, docs/reshard.md), the first swap-out of a 0.5B / 1.5B model's update state
(7.4 / 23 GiB) took 8.9 / 16.3 s with new pinned buffers per swap and 3.8 / 9.9 s with this arena; every later
swap copies at 51-54 GB/s either way (torch's pinned allocator caches its blocks, but rounds each up to a power
of two). So an engine pins the exact bytes once, on CUDA by ``cudaHostRegister`` on ordinary host memory
(elsewhere from torch's pinned allocator), and later swaps only copy. The arena holds one swap at a time: the
engine swaps back before it swaps out again.
"""

from __future__ import annotations

import torch

ALIGN = 512  # bytes: every slice starts aligned, so each copy runs at full width


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class PinnedArena:
    """Page-locked host bytes for one device's swaps, grown (re-pinned) only when a swap needs more."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._host: torch.Tensor | None = None
        self._registered = False
        self.busy = False

    @property
    def nbytes(self) -> int:
        """The bytes pinned now."""
        return 0 if self._host is None else self._host.numel()

    def slices(self, sizes: list[int]) -> list[torch.Tensor]:
        """One uint8 host slice per size, for one swap-out; :meth:`release` when it has been swapped back."""
        if self.busy:
            raise RuntimeError(f"the pinned arena of {self.device} still holds a swap; swap it back first")
        total = sum(_aligned(n) for n in sizes)
        if total > self.nbytes:
            self.close()
            self._host = self._pin(total)
        out, offset = [], 0
        assert self._host is not None or not sizes
        for n in sizes:
            out.append(self._host[offset : offset + n])
            offset += _aligned(n)
        self.busy = True
        return out

    def release(self) -> None:
        """The last swap is back on the device: its slices may be reused."""
        self.busy = False

    def _pin(self, nbytes: int) -> torch.Tensor:
        if self.device.type == "cpu":  # nothing to page-lock for: plain host memory (tests, the CPU stand-in)
            return torch.empty(nbytes, dtype=torch.uint8)
        if self.device.type != "cuda":
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host = torch.empty(nbytes, dtype=torch.uint8)
        torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(host.data_ptr(), nbytes, 0))
        self._registered = True
        return host

    def close(self) -> None:
        """Unpin and free the buffer (the engine's end, or before a larger one)."""
        if self._host is not None and self._registered:
            torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(self._host.data_ptr()))
        self._host, self._registered = None, False

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver frees it with the process
            pass
