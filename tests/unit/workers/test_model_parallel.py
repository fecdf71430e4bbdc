"""``shared_stream`` on 2 forked gloo ranks: the reader's items (TensorDicts, as the actor passes them) reach the
other rank in order and both streams end together."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict

from dockflow.workers.model_parallel import shared_stream


def _batches() -> list[TensorDict]:
    return [TensorDict({"x": torch.arange(k * 3, k * 3 + 3)}, batch_size=[3]) for k in range(3)]


def _rank(rank: int, tmp: str) -> None:
    store = dist.FileStore(str(Path(tmp) / "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30))
    reader = rank == 0
    seen = [b["x"] for b in shared_stream(iter(_batches()) if reader else None, reader)]
    seen_again = list(shared_stream(iter([]) if reader else None, reader))  # an empty stream ends on every rank
    torch.save({"seen": seen, "again": seen_again}, Path(tmp) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_every_rank_sees_the_readers_batches(tmp_path):
    mp.start_processes(_rank, args=(str(tmp_path),), nprocs=2, start_method="fork")
    expected = [b["x"] for b in _batches()]
    for rank in range(2):
        out = torch.load(tmp_path / f"rank{rank}.pt")
        assert len(out["seen"]) == 3 and all(torch.equal(a, b) for a, b in zip(out["seen"], expected, strict=True))
        assert out["again"] == []
