"""Who asks whom for what: the routing decisions of the dock's protocol, shared by the Ray clients and actors
and by the protocol simulator (``benchmarks/dock_sim_engine.py``), so a change here shows up in both.

Distributed backend (paper Fig. 4):

- put: the client splits the rows by owning warehouse (``ShardMap.split``) and sends each part to its
  warehouse; each warehouse stores its rows and notifies ``notify_targets`` (one message per controller);
  the put returns when every notification is acknowledged.
- get: the client asks the consumer's controller (one round trip; the controller long-polls), naming
  ``local_shards`` so samples on its own node come first, then reads the rows from the owning warehouses
  (``ShardMap.split`` again, one message each, in parallel).

Centralized backend (paper Fig. 2): a put is one message to the buffer, which marks every consumer's
bookkeeping ready; a get is one round trip that returns indices, data and metadata.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np


def notify_targets(interests: Mapping[str, Iterable[str]], columns: Sequence[str], has_meta: bool) -> list[str]:
    """Consumers whose controllers a warehouse tells about a put of ``columns``: every one when the put carries
    metadata (all controllers keep it), otherwise those whose consumer reads one of the columns."""
    return [c for c, wanted in interests.items() if has_meta or set(wanted).intersection(columns)]


def local_shards(warehouse_nodes: Sequence[str], node: str) -> list[int] | None:
    """Warehouses on ``node``, whose samples a get from that node prefers; None when that is all or none."""
    local = [i for i, n in enumerate(warehouse_nodes) if n == node]
    return local if 0 < len(local) < len(warehouse_nodes) else None


def payload_bytes(*parts: np.ndarray | Mapping[str, np.ndarray] | None) -> int:
    """Bytes of the arrays a message carries (index arrays, column arrays, metadata arrays)."""
    total = 0
    for part in parts:
        if part is None:
            continue
        if isinstance(part, np.ndarray):
            total += part.nbytes
        else:
            total += sum(a.nbytes for a in part.values())
    return total
