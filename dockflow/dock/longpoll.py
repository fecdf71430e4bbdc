"""Server-side long-poll: wait on an asyncio.Condition until a take succeeds or the deadline passes.

Puts ``notify_all`` the condition; waiting gets re-try their take. No client-side sleeping or polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def take_when_ready(cond: asyncio.Condition, attempt: Callable[[], T | None], timeout_s: float) -> T | None:
    """Run ``attempt`` under ``cond`` until it returns a value; None once ``timeout_s`` has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with cond:
        while True:
            result = attempt()
            if result is not None:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(cond.wait(), remaining)
            except asyncio.TimeoutError:
                pass  # one last attempt above, then None
