"""A model worker keeps freed host memory (``ray.retain_host_memory``): a large tensor comes from glibc's heap, not
from its own mmap, and the heap keeps it after it is freed. Each case runs in a fresh interpreter, since the setting
is the whole process's; glibc's ``mallinfo2`` counts the bytes in mmap-ed chunks and in the heap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dockflow.workers.host_memory import glibc

pytestmark = pytest.mark.skipif(glibc() is None or not hasattr(glibc(), "mallinfo2"), reason="glibc's malloc")

MIB40 = 40 * 2**20  # above glibc's largest mmap threshold (32 MiB): with its defaults always a chunk of its own

SCRIPT = """
import ctypes, json, sys
import torch
from dockflow.config import RayConfig
from dockflow.workers.host_memory import glibc
from dockflow.workers.runtime import init_worker_process

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]

mallinfo2 = glibc().mallinfo2
mallinfo2.restype = Info
init_worker_process(RayConfig(retain_host_memory=sys.argv[1] == "true", torch_threads=1), seed=0)
x = torch.ones(10 * 2**20)
alive = mallinfo2()
del x
freed = mallinfo2()
print(json.dumps({"mmapped_alive": alive.hblkhd, "heap_after_free": freed.arena}))
"""


def allocation(retain: bool) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(retain).lower()], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_worker_serves_a_large_tensor_from_the_heap_and_keeps_it():
    seen = allocation(retain=True)
    assert seen["mmapped_alive"] < MIB40  # not a chunk of its own, whose pages munmap would drop
    assert seen["heap_after_free"] >= MIB40  # freed, and still in the heap for the next iteration


def test_the_c_librarys_default_maps_it_on_its_own():
    assert allocation(retain=False)["mmapped_alive"] >= MIB40


NOT_GLIBC = """
import sys
import dockflow.workers.host_memory as host_memory
from dockflow.config import RayConfig
from dockflow.workers.runtime import init_worker_process

host_memory.glibc = lambda: None  # as on musl or macOS
init_worker_process(RayConfig(retain_host_memory=sys.argv[1] == "true", torch_threads=1), seed=0)
"""


@pytest.mark.parametrize("retain", [True, False])
def test_a_process_without_glibc_says_so_in_one_line(retain):
    out = subprocess.run([sys.executable, "-c", NOT_GLIBC, str(retain).lower()], capture_output=True, text=True,
                         timeout=120, check=True)
    said = [line for line in out.stderr.splitlines() if "ray.retain_host_memory" in line]
    assert len(said) == (1 if retain else 0), out.stderr
