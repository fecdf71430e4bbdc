"""A run's checkpoint, for both drivers (the CLI loop and the KFP pipeline's tasks): which workers write a part
(``stateful``), the driver's part and the commit (``commit_checkpoint``: the record of the run, ``RunRecord`` of
``dockflow.flow.run_record``, and the config, then the manifest), reading the record back (``read_record``) and
restoring the workers (``restore_workers``).
"""

from __future__ import annotations

from typing import Any

from dockflow.config import Config
from dockflow.flow.run_record import RunRecord
from dockflow.flow.waiting import wait_stages
from dockflow.redact import redact_config
from dockflow.workers import Workers


def stateful(workers: Workers) -> dict[str, Any]:
    """Workers whose state a checkpoint holds (each writes its own part; the actor ranks, and the critic ranks, save
    and load together: rank 0 writes the "actor" ("critic") part, every rank reads it)."""
    named = {"actor": workers.actor, "critic": workers.critic}
    named.update({f"actor-{k}": a for k, a in enumerate(workers.actors) if k > 0})
    named.update({f"critic-{k}": c for k, c in enumerate(workers.critics) if k > 0})
    return {k: v for k, v in named.items() if v is not None}


def commit_checkpoint(store, step: int, rec: RunRecord, cfg: Config) -> None:
    """After the workers wrote their parts: the driver's record and the config, then the manifest (the commit)."""
    store.write_part(step, "driver", rec.to_dict())
    store.write_part(step, "config", redact_config(cfg.model_dump()))  # what produced it, secrets hidden
    store.commit(step, {"iteration": step, "accuracy": rec.last_accuracy})


def read_record(store, step: int) -> RunRecord:
    """The driver's record in checkpoint ``step`` (written by this DockFlow or the one before: ``RunRecord.from_dict``)."""
    return RunRecord.from_dict(store.read_part(step, "driver"))


def restore_workers(store, workers: Workers, step: int, cfg: Config) -> None:
    refs = {f"restore_{k}": w.load.remote(store, step) for k, w in stateful(workers).items()}
    wait_stages(refs, cfg.train.stage_timeout_s, step)
