"""What the resharding benchmarks (``reshard.py``, ``reshard_megatron.py``, ``reshard_device.py``) record of one
reshard once generation could start, and how each ends it, as an engine does before its next update."""

from __future__ import annotations

from typing import Any

from dockflow.reshard import UPDATE_STATE, MemoryLedger, ReshardResult


def finish_generation(result: ReshardResult, ledger: MemoryLedger) -> dict[str, Any]:
    """What every resharding benchmark records at generation (the ledger's generation and update-state bytes, the
    reshard and swap times), then the swap-back (allgather-swap: its bytes and time) and the generation weights
    dropped, as an engine does before its next update."""
    ready = ledger.snapshots("generation")[-1]
    record = {
        "gen_weights_bytes": ready.by_category["generation_weights"],
        "update_state_bytes_in_gen": sum(ready.by_category[c] for c in UPDATE_STATE),
        "reshard_s": result.reshard_s, "swap_s": result.swap_s, "swap_back_s": 0.0, "host_bytes": 0,
    }
    if result.swap is not None:
        record["host_bytes"] = result.swap.host_bytes
        result.swap.swap_back(timeout=600)
        record["swap_back_s"] = result.swap.swap_back_s
    result.release_generation(ledger)
    return record
