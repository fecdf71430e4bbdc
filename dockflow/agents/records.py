"""What a tool rollout hands the reward functions besides its tokens: the conversation and the environment.

The dock carries fixed-width numeric columns, so each trajectory's record travels as one row of bytes
(``tool_record``, ``tools.record_bytes`` wide: a 4-byte length, the pickle, zeros):

    row = pack_record(TrajectoryRecord(prompt, completion, state, reward, "Counter"), width=16384)
    unpack_record(row).completion     # [{"role": "assistant", ...}, {"role": "tool", ...}, ...]

``prompt`` is the prompt as the model saw it (an environment's observation appended to the last user message),
``completion`` the turns after it in TRL's conversational form (assistant turns with their parsed
``tool_calls``, then the tool messages), ``state`` a copy of the environment instance after ``get_reward()``
(None without an environment), ``reward`` what ``get_reward()`` returned. The records are written by the
generating worker and read by the reward worker, both DockFlow's own processes.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np

HEADER = 4  # bytes of the length prefix


@dataclass
class TrajectoryRecord:
    """One trajectory as reward functions see it (see the module doc)."""

    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    state: Any = None
    reward: float | None = None
    environment: str | None = None


class RecordTooLarge(ValueError):
    """A trajectory's record does not fit ``tools.record_bytes``; the message gives both sizes."""


def pack_record(record: TrajectoryRecord, width: int) -> np.ndarray:
    """``record`` as ``width`` bytes (uint8); RecordTooLarge when its pickle needs more."""
    data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) + HEADER > width:
        what = f" (environment {record.environment!r} included)" if record.environment else ""
        raise RecordTooLarge(
            f"a trajectory's record{what} takes {len(data) + HEADER} bytes, more than tools.record_bytes={width}: "
            "raise tools.record_bytes (or lower tools.max_total_tokens, or keep less state in the environment)"
        )
    row = np.zeros(width, dtype=np.uint8)
    row[:HEADER] = np.frombuffer(len(data).to_bytes(HEADER, "little"), dtype=np.uint8)
    row[HEADER : HEADER + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return row


def unpack_record(row: Any) -> TrajectoryRecord:
    """The record in one ``tool_record`` row (a numpy array or tensor of uint8)."""
    raw = np.asarray(row, dtype=np.uint8).tobytes()
    size = int.from_bytes(raw[:HEADER], "little")
    return pickle.loads(raw[HEADER : HEADER + size])  # noqa: S301 - written by this run's own generating worker
