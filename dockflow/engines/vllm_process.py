"""The process around an in-process vLLM engine while it is imported and starts (``VLLMGenerationEngine``):
what it needs bound, and what it leaves behind in ``os.environ``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def flask_proxies_bound() -> Iterator[None]:
    """While vLLM starts: flask's request-bound proxies (``request``, ``session``, ``g``, ``current_app``) resolve.

    vLLM 0.32's CPU platform, when it starts, scans every attribute of every loaded module with
    ``hasattr(value, "__dict__")`` (``vllm/triton_utils/dispatcher.py``, ``_rebind_kernels``); outside a request
    those proxies raise RuntimeError, not AttributeError, so vLLM cannot start in a process that imported flask
    (an MLflow or S3 test server, a user's module). A throwaway request context binds them; nothing else changes."""
    flask = sys.modules.get("flask")
    if flask is None:
        yield
        return
    with flask.Flask("dockflow-vllm-start").test_request_context():
        yield


# vLLM's own settings, which it reads while it runs; everything else it sets is for the processes it starts.
VLLM_RUNTIME_PREFIXES = ("VLLM_", "TORCHINDUCTOR_", "TRITON_")


@contextmanager
def spawn_settings_restored() -> Iterator[None]:
    """While vLLM is imported and starts: what it writes into ``os.environ`` for the processes it spawns (its CPU platform
    sets ``LD_PRELOAD`` to torch's libgomp, ``KMP_*``, ``LOCAL_WORLD_SIZE=1``, ...) is undone afterwards, so it
    does not leak into every process the DockFlow worker starts later (a torch.distributed spawn, a reward
    sandbox). vLLM's runtime settings (``VLLM_RUNTIME_PREFIXES``) stay."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) | set(before):
            if key.startswith(VLLM_RUNTIME_PREFIXES) or os.environ.get(key) == before.get(key):
                continue
            if key in before:
                os.environ[key] = before[key]
            else:
                del os.environ[key]
