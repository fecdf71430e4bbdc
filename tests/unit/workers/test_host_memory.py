"""A model worker keeps freed host memory (``ray.retain_host_memory``): reallocating a large tensor needs no new
pages. Each case runs in a fresh interpreter, since the setting is the whole process's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dockflow.workers.host_memory import glibc

pytestmark = pytest.mark.skipif(glibc() is None, reason="the malloc settings are glibc's")

# A 64 MiB tensor (above glibc's largest mmap threshold, 32 MiB) made, freed and made again; prints the page
# faults of the second one.
SCRIPT = """
import resource, sys
import torch
from dockflow.config import RayConfig
from dockflow.workers.runtime import init_worker_process

init_worker_process(RayConfig(retain_host_memory=sys.argv[1] == "true", torch_threads=1), seed=0)
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
x = torch.ones(16 * 2**20); del x
before = faults()
x = torch.ones(16 * 2**20); del x
print(faults() - before)
"""


def second_allocation_faults(retain: bool) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(retain).lower()], capture_output=True, text=True,
                         timeout=120, check=True)
    return int(out.stdout.split()[-1])


def test_a_worker_reuses_freed_memory_without_new_pages():
    assert second_allocation_faults(retain=True) < 500  # the heap kept the pages: nothing to fault in


def test_the_c_librarys_default_maps_fresh_pages_each_time():
    assert second_allocation_faults(retain=False) > 10_000  # 64 MiB in 4 KiB pages: 16,384 faults
