"""The paper's throughput, Eq. (5): T = G x N x (PL + SL) / ND / ETE, tokens per second per device.

G prompts x N responses per iteration, PL/SL the mean prompt and response lengths in tokens, ND the
devices used (CPU cores of the model workers on this machine), ETE the end-to-end seconds of the iteration.
"""

from __future__ import annotations


def throughput_tps(samples: int, prompt_len: float, response_len: float, devices: float, seconds: float) -> float:
    """Eq. (5) throughput in tokens / s / device."""
    if seconds <= 0 or devices <= 0:
        return 0.0
    return samples * (prompt_len + response_len) / devices / seconds
