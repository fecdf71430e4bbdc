"""Rule rewards: math answer verification and a format check.

    from dockflow.rewards import verify
    reward = verify(response_text, example.answer)   # 1.0 or 0.0
"""

from __future__ import annotations

from dockflow.rewards.math_verify import canonical_answer, extract_answer, format_reward, verify

__all__ = ["canonical_answer", "extract_answer", "format_reward", "verify"]
