"""Checkpoints that cannot run code: a part crafted to run code when unpickled, placed in the store with its
checksums fixed (as a writer of the bucket could), is refused at resume and never runs; a format-1 checkpoint is
refused in one line; with a checkpoint key a rewritten manifest is refused too; the part format round-trips what
a run saves (RNG states bit-identical) and rebuilds only the classes its reader names."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import random
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load as safetensors_load
from tensordict import TensorDict

from dockflow.flow.run_checkpoint import read_record
from dockflow.flow.run_record import RunRecord
from dockflow.storage import CheckpointError, OldCheckpointError
from dockflow.storage.manifest import MANIFEST_NAME, part_filename, record_filename
from dockflow.storage.part_format import read_part_file, write_part_file
from dockflow.storage.signing import KEY_ENV, KEY_FILE_ENV
from dockflow.workers.runtime import ModelWorker, rng_state

KEY = "0123456789abcdef0123456789abcdef"


class RunsCode:
    """Unpickled, it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def _plant(store, raw, step: int, name: str, payload: bytes) -> None:
    """Replace part ``name`` of committed ``step`` by ``payload`` and fix its record and the manifest's checksum."""
    raw.put(store, step, part_filename(name), payload)
    info = {"file": part_filename(name), "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    raw.put(store, step, record_filename(name), json.dumps(info).encode())
    manifest = json.loads(raw.get(store, step, MANIFEST_NAME))
    manifest["parts"][name] = info
    raw.put(store, step, MANIFEST_NAME, json.dumps(manifest).encode())


def _commit_run(store, step: int) -> None:
    store.write_part(step, "driver", RunRecord(iteration=step).to_dict())
    store.write_part(step, "actor", {"engine": {"model": {"w": torch.ones(2)}}, "rng": rng_state()})
    store.commit(step, {"iteration": step})


def test_the_payload_is_live(tmp_path: Path) -> None:
    """The crafted pickle does run code when unpickled (what torch.load(weights_only=False) did)."""
    pickle.loads(pickle.dumps(RunsCode(tmp_path / "live")))  # noqa: S301 - the test's own payload
    assert (tmp_path / "live").exists()


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_part_that_runs_code_is_refused_at_resume_and_never_runs(make_store, raw, tmp_path: Path, how: str) -> None:
    store = make_store(keep=3)
    _commit_run(store, 2)
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    if how == "pickle":
        pickle.dump(RunsCode(marker), buffer)
    else:
        torch.save({"engine": RunsCode(marker)}, buffer)
    for name in ("driver", "actor"):
        _plant(store, raw, 2, name, buffer.getvalue())
    assert store.latest() == 2  # the checksums match: only the format stands between the bucket and the run
    with pytest.raises(CheckpointError, match="is not a DockFlow part") as err:
        read_record(store, 2)  # the driver's resume
    assert "\n" not in str(err.value)
    worker = ModelWorker.__new__(ModelWorker)
    worker.part = "actor"
    with pytest.raises(CheckpointError, match="is not a DockFlow part"):
        worker.load(store, 2)  # every worker's resume
    assert not marker.exists()


def test_a_pickled_checkpoint_of_format_1_is_refused_in_one_line(make_store, raw, tmp_path: Path) -> None:
    store = make_store(keep=3)
    _commit_run(store, 1)
    marker = tmp_path / "pwned"
    payload = pickle.dumps(RunsCode(marker))
    store.write_part(4, "other", {})  # the step's folder
    raw.put(store, 4, "driver.pt", payload)
    raw.put(store, 4, MANIFEST_NAME, json.dumps({"format_version": 1, "step": 4, "created_unix": 0.0, "meta": {},
                                                 "parts": {"driver": {"file": "driver.pt", "size": len(payload),
                                                           "sha256": hashlib.sha256(payload).hexdigest()}}}).encode())
    with pytest.raises(OldCheckpointError, match="pickled parts") as err:
        store.latest()  # never skipped for step 1: the run would start over next to it
    assert "\n" not in str(err.value) and "checkpoint.dir" in str(err.value)
    assert not marker.exists()


def test_with_a_key_a_rewritten_checkpoint_is_refused_and_the_signed_one_used(
    make_store, raw, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    store = make_store(keep=3)
    _commit_run(store, 1)
    _commit_run(store, 2)
    assert "signature" in json.loads(raw.get(store, 2, MANIFEST_NAME))
    forged = RunRecord(iteration=99).to_dict()
    buffer = io.BytesIO()
    write_part_file(forged, buffer)  # a valid part: only the signature tells it apart
    _plant(store, raw, 2, "driver", buffer.getvalue())
    with caplog.at_level(logging.WARNING):
        assert store.latest() == 1
    assert "does not match this run's checkpoint key" in caplog.text
    with pytest.raises(CheckpointError, match="does not match"):
        store.read_part(2, "driver")
    manifest = json.loads(raw.get(store, 1, MANIFEST_NAME))
    del manifest["signature"]
    raw.put(store, 1, MANIFEST_NAME, json.dumps(manifest).encode())
    with pytest.raises(CheckpointError, match="is not signed, but a checkpoint key is set"):
        store.read_manifest(1)


def test_a_bad_key_is_one_line(make_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "short")
    store = make_store(keep=1)
    store.write_part(1, "a", {})
    with pytest.raises(CheckpointError, match=r"fewer than 16: use a random one"):
        store.commit(1, {})
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(CheckpointError, match="cannot read the checkpoint key file"):
        store.commit(1, {})


@dataclass
class Parked:
    prompt_id: int
    saved: bytes | None = None


def test_the_part_format_round_trips_a_run_state_and_names_its_classes() -> None:
    opt = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters())
    opt.zero_grad()
    torch.nn.Linear(3, 2)(torch.ones(1, 3)).sum().backward()
    random.random()
    state = {"rng": rng_state(), "opt": opt.state_dict(), "bf16": torch.randn(3, 2).to(torch.bfloat16),
             "windows": {3: {"data": TensorDict({"ids": torch.arange(6).view(2, 3)}, batch_size=[2])}},
             "queue": {"parked": [Parked(7, b"\x80env")], "stream": deque([4, 5]), "streamed": {1, 2}},
             "misc": (np.float64(0.5), float("inf"), None, torch.int8, torch.Size([2]), b"")}
    buffer = io.BytesIO()
    write_part_file(state, buffer)
    assert safetensors_load(buffer.getvalue())  # a valid safetensors file
    with pytest.raises(CheckpointError, match="holds a .*Parked, which its reader does not accept"):
        read_part_file(io.BytesIO(buffer.getvalue()), "x")
    back = read_part_file(io.BytesIO(buffer.getvalue()), "x", types=(Parked,))
    assert back["queue"] == state["queue"] and back["misc"][1:] == state["misc"][1:]
    assert type(back["misc"][0]) is np.float64 and back["opt"]["state"].keys() == state["opt"]["state"].keys()
    assert torch.equal(back["bf16"], state["bf16"]) and torch.equal(back["windows"][3]["data"]["ids"],
                                                                    state["windows"][3]["data"]["ids"])
    assert back["opt"]["param_groups"] == state["opt"]["param_groups"]
    random.setstate(back["rng"]["python"])
    np.random.set_state(back["rng"]["numpy"])
    torch.set_rng_state(back["rng"]["torch"])
    assert rng_state()["python"] == state["rng"]["python"] and torch.equal(torch.get_rng_state(), state["rng"]["torch"])
    assert np.array_equal(np.random.get_state()[1], state["rng"]["numpy"][1])


def test_what_a_part_cannot_hold_is_refused_at_save_naming_where() -> None:
    with pytest.raises(CheckpointError, match=r"at <part>\.queue\[0\] is a builtins\.function"):
        write_part_file({"queue": [lambda: 1]}, io.BytesIO())
