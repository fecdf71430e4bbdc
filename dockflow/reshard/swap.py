"""Swap tensors' device storages to host memory and back (the "swap" of allgather-swap).

Swapping works on untyped storages: each distinct storage is copied byte for byte to a host buffer and
then resized to zero, which releases the device memory while every tensor object (parameters, their views,
grads, optimizer state) keeps its identity, shape and strides. ``swap_back`` re-grows each storage and
copies the bytes back, so the restored state is bit-identical and the optimizer's references stay valid.
On CPU the "device" is emulated: the host copy is a separate CPU allocation and the original storages are
really freed. On CUDA / NPU host buffers are pinned and swap-back copies run on a side stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import ModuleType

import torch

from dockflow.reshard.accelerator import accelerator_of
from dockflow.reshard.host_arena import PinnedArena


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class HostSwap:
    """Device storages swapped to host; ``swap_back`` (or ``start_swap_back`` to overlap) restores them."""

    def __init__(self, device: torch.device, entries: list[tuple[torch.UntypedStorage, torch.Tensor]],
                 seconds: float, arena: PinnedArena | None = None) -> None:
        self.device = device
        self._entries = entries
        self._arena = arena
        self.host_bytes = sum(host.numel() for _, host in entries)
        self.swap_out_s = seconds
        self.swap_back_s: float | None = None
        self._future: Future[None] | None = None
        self._lock = threading.Lock()

    @classmethod
    def swap_out(cls, tensors: Iterable[torch.Tensor], device: torch.device | str,
                 pin_memory: bool | None = None, arena: PinnedArena | None = None) -> HostSwap:
        """Copy the storages of ``tensors`` that live on ``device`` to host, then release them on the device.
        ``arena``: pinned host bytes reused from swap to swap (``host_arena.py``); else new host buffers."""
        device = torch.device(device)
        accel = accelerator_of(device)
        pin = accel is not None if pin_memory is None else pin_memory
        started = time.perf_counter()
        storages: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            if t.device.type != device.type or (device.index is not None and t.device.index != device.index):
                continue
            storage = t.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in storages:
                storages[storage.data_ptr()] = storage
        fixed = [s for s in storages.values() if not s.resizable()]
        if fixed:
            raise ValueError(f"{len(fixed)} of {len(storages)} storages to swap cannot be resized (shared with numpy or "
                             "created from external memory), so their device memory could not be released")
        entries = []
        hosts = (arena.slices([s.nbytes() for s in storages.values()]) if arena is not None else
                 [torch.empty(s.nbytes(), dtype=torch.uint8, pin_memory=pin) for s in storages.values()])
        pin = pin or arena is not None
        for storage, host in zip(storages.values(), hosts, strict=True):
            host.copy_(_as_bytes(storage), non_blocking=pin)
            entries.append((storage, host))
        if accel is not None:
            accel.synchronize(device)  # the host copies must be complete before the device memory goes
        for storage, _ in entries:
            storage.resize_(0)
        return cls(device, entries, time.perf_counter() - started, arena)

    @property
    def done(self) -> bool:
        """True once the swap-back has finished."""
        return self._future is not None and self._future.done()

    def start_swap_back(self) -> Future[None]:
        """Start restoring in a background thread (idempotent); the future resolves when all bytes are back."""
        with self._lock:
            if self._future is None:
                self._future = Future()
                threading.Thread(target=self._run, name="reshard-swap-back", daemon=True).start()
            return self._future

    def swap_back(self, timeout: float | None = 600.0) -> None:
        """Restore every storage (starting the copy if not yet started) and wait for it."""
        future = self.start_swap_back()
        try:
            future.result(timeout=timeout)
        except FutureTimeout:
            raise TimeoutError(f"swap-back of {self.host_bytes} bytes to {self.device} did not finish within "
                               f"{timeout} s") from None

    def _run(self) -> None:
        assert self._future is not None
        try:
            started = time.perf_counter()
            accel = accelerator_of(self.device)
            if accel is None:
                self._restore()
            else:
                with accel.device(self.device):
                    self._restore_async(accel)
            self._entries = []  # the host copies are no longer needed
            if self._arena is not None:
                self._arena.release()
            self.swap_back_s = time.perf_counter() - started
            self._future.set_result(None)
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
            self._future.set_exception(err)

    def _restore(self) -> None:
        for storage, host in self._entries:
            storage.resize_(host.numel())
            _as_bytes(storage).copy_(host)

    def _restore_async(self, accel: ModuleType) -> None:
        """Allocate on the current stream (as the tensors' later users will), copy H2D on a side stream."""
        for storage, host in self._entries:
            storage.resize_(host.numel())
        stream = accel.Stream(self.device)
        stream.wait_stream(accel.current_stream(self.device))
        with accel.stream(stream):
            for storage, host in self._entries:
                _as_bytes(storage).copy_(host, non_blocking=True)
        stream.synchronize()
