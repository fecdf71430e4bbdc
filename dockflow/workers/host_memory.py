"""Keep a model worker's freed host memory for its next iteration (glibc's ``malloc``).

Every iteration a worker allocates and frees the same large host tensors: activations and attention scores of
the update, KV caches of generation. glibc serves each allocation above its mmap threshold (which moves up to 32
MiB) with a fresh ``mmap`` and gives it back with ``munmap`` when freed, so the next iteration touches new pages
and the kernel faults in and zeroes each 4 KiB page again. On the larger setup of ``benchmarks/vs_trl.py`` that
was 0.6-1.6 million page faults and 3-6 s of system time per update, and 8 million faults in the first
generation (docs/vs_trl.md, "Measured again (2026-11-27, evening: model workers keep freed host memory)").

``retain_freed_memory`` sets glibc to serve every allocation from its heap and to keep freed memory there
(``mallopt``: no mmap-ed chunks, a 2 GiB trim threshold): what one iteration freed, the next reuses, without a
fault. The cost is resident memory: the worker keeps its peak heap. ``ray.retain_host_memory: false`` leaves
the C library's defaults. Where glibc serves a thread from one of its per-thread arenas (heaps of at most 64 MiB),
a chunk larger than such a heap is still mmap-ed; a worker's tensors are made by its main thread, usually in the main
arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4

TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: 2 GiB of free heap top before any is given back
TOP_PAD = 64 * 2**20  # grow the heap 64 MiB at a time: fewer brk calls while it reaches its peak


def glibc() -> ctypes.CDLL | None:
    """This process's C library if it is glibc (it has ``mallopt``), else None (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return None
    return libc


def retain_freed_memory() -> bool:
    """Serve this process's allocations from the heap and keep what is freed there (see the module docstring).
    Returns whether the settings took effect: False off glibc, where the process runs with its defaults."""
    libc = glibc()
    if libc is None:
        return False
    settings = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)
