"""The data-only format of a checkpoint part: a safetensors file whose metadata holds the part's tree as JSON.

    write_part_file(obj, f)                         # what ``write_part`` streams into the store
    obj = read_part_file(source, where, types=())   # a path or an open binary file; never runs code

Every tensor, numpy array and ``bytes`` of the tree is a tensor of the file (bytes as uint8); the rest of the tree
is JSON in the file's ``__metadata__`` (key ``dockflow``), with tagged objects (``{"$df": ...}``) for what JSON
lacks: tuples, dicts with non-string keys, sets, deques, torch dtypes and sizes, numpy scalars, TensorDicts and
dataclass instances. Reading parses JSON and raw tensor bytes only: nothing is unpickled and no class is imported
by a name found in the file. A dataclass is rebuilt only when the reader passes its class in ``types`` (the
rollout queue's classes for the in-flight part); any other name is refused in one line. What is written must be
one of these kinds: anything else (a lambda, an open file, an arbitrary object) is refused at save, naming where
it is in the tree, so no part ever needs pickle to be read back.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from dockflow.storage.manifest import CheckpointError

TAG = "$df"
TREE_KEY = "dockflow"  # the key of the tree in the safetensors metadata
MAX_HEADER = 100_000_000  # safetensors' own limit on the header
DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
BY_NAME = {v: k for k, v in DTYPES.items()}


def type_name(cls: type) -> str:
    """The name a class is recorded under: ``module.QualName``."""
    return f"{cls.__module__}.{cls.__qualname__}"


class _Encoder:
    """Turns a tree into JSON values and a table of tensors."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def _tensor(self, t: torch.Tensor) -> str:
        key = f"t{len(self.tensors)}"
        self.tensors[key] = t.detach().cpu().contiguous()
        return key

    def encode(self, obj: Any, path: str) -> Any:
        """The JSON value of ``obj`` (found at ``path`` of the tree); its tensors go to ``self.tensors``."""
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, np.generic):  # before int/float: np.float64 is a float
            return {TAG: "npscalar", "dtype": obj.dtype.str, "hex": obj.tobytes().hex()}
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, (torch.Tensor, np.ndarray, bytes, bytearray)):
            return self._array(obj, path)
        if isinstance(obj, torch.dtype):
            return {TAG: "dtype", "v": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.Size):
            return {TAG: "size", "v": list(obj)}
        return self._container(obj, path)

    def _array(self, obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.dtype not in DTYPES:
                raise CheckpointError(f"checkpoint part value at {path} is a {obj.dtype} tensor, which a part cannot "
                                      f"hold: convert it to one of {sorted(str(d) for d in DTYPES)}")
            return {TAG: "tensor", "k": self._tensor(obj)}
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise CheckpointError(f"checkpoint part value at {path} is a numpy array of Python objects: "
                                      "store a numeric array or a list instead")
            raw = torch.from_numpy(np.ascontiguousarray(obj).reshape(-1).view(np.uint8).copy())
            return {TAG: "ndarray", "k": self._tensor(raw), "dtype": obj.dtype.str, "shape": list(obj.shape)}
        data = torch.frombuffer(bytearray(obj), dtype=torch.uint8) if obj else torch.empty(0, dtype=torch.uint8)
        return {TAG: "bytes", "k": self._tensor(data)}

    def _container(self, obj: Any, path: str) -> Any:
        if isinstance(obj, list):
            return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return {TAG: "tuple", "v": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]}
        if isinstance(obj, dict):
            return self._dict(obj, path)
        if isinstance(obj, (set, frozenset)):
            kind = "frozenset" if isinstance(obj, frozenset) else "set"
            return {TAG: kind, "v": [self.encode(v, f"{path}{{}}") for v in obj]}
        if isinstance(obj, deque):
            return {TAG: "deque", "maxlen": obj.maxlen, "v": [self.encode(v, f"{path}[]") for v in obj]}
        return self._object(obj, path)

    def _dict(self, obj: dict, path: str) -> Any:
        if all(isinstance(k, str) for k in obj) and TAG not in obj:
            return {k: self.encode(v, f"{path}.{k}") for k, v in obj.items()}
        return {TAG: "dict", "v": [[self.encode(k, f"{path}<key>"), self.encode(v, f"{path}[{k!r}]")]
                                   for k, v in obj.items()]}

    def _object(self, obj: Any, path: str) -> Any:
        from tensordict import TensorDictBase

        if isinstance(obj, TensorDictBase):
            items = {k: self.encode(v, f"{path}.{k}") for k, v in obj.items()}
            return {TAG: "tensordict", "batch_size": list(obj.batch_size), "v": items}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = {f.name: self.encode(getattr(obj, f.name), f"{path}.{f.name}") for f in dataclasses.fields(obj)}
            return {TAG: "obj", "type": type_name(type(obj)), "v": fields}
        if isinstance(obj, tuple):  # a NamedTuple
            fields = {name: self.encode(getattr(obj, name), f"{path}.{name}") for name in obj._fields}
            return {TAG: "obj", "type": type_name(type(obj)), "v": fields}
        raise CheckpointError(
            f"checkpoint part value at {path} is a {type_name(type(obj))}, which a data-only part cannot hold: store "
            "tensors, numpy arrays, bytes, JSON values, tuples, dicts, sets, deques, TensorDicts or dataclasses"
        )


class _Decoder:
    """Turns JSON values and tensors back into the tree; classes only from ``types``."""

    def __init__(self, tensors: dict[str, torch.Tensor], types: Iterable[type], where: str) -> None:
        self.tensors, self.where = tensors, where
        self.types = {type_name(t): t for t in types}

    def bad(self, why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint part {self.where} {why}: it was not written by DockFlow, resume from "
                               "another checkpoint")

    def tensor(self, key: Any) -> torch.Tensor:
        if key not in self.tensors:
            raise self.bad(f"refers to a tensor {key!r} it does not hold")
        return self.tensors[key]

    def decode(self, v: Any) -> Any:
        """The tree value of the JSON value ``v``."""
        if isinstance(v, list):
            return [self.decode(x) for x in v]
        if not isinstance(v, dict):
            return v
        if TAG not in v:
            return {k: self.decode(x) for k, x in v.items()}
        kind = v[TAG]
        if kind not in self.kinds:
            raise self.bad(f"holds an unknown kind {kind!r}")
        try:
            return self.kinds[kind](v)
        except (KeyError, TypeError, ValueError) as exc:
            raise self.bad(f"holds a malformed {kind} ({type(exc).__name__}: {exc})") from None

    @property
    def kinds(self) -> dict[str, Any]:
        return {"tensor": lambda v: self.tensor(v["k"]), "bytes": lambda v: self.tensor(v["k"]).numpy().tobytes(),
                "ndarray": self._ndarray, "npscalar": self._npscalar, "dtype": self._dtype,
                "size": lambda v: torch.Size(int(x) for x in v["v"]),
                "tuple": lambda v: tuple(self.decode(x) for x in v["v"]),
                "dict": lambda v: {_hashable(self.decode(k)): self.decode(x) for k, x in v["v"]},
                "set": lambda v: {_hashable(self.decode(x)) for x in v["v"]},
                "frozenset": lambda v: frozenset(_hashable(self.decode(x)) for x in v["v"]),
                "deque": lambda v: deque((self.decode(x) for x in v["v"]), maxlen=v["maxlen"]),
                "tensordict": self._tensordict, "obj": self._object}

    def _numpy_dtype(self, name: Any) -> np.dtype:
        dtype = np.dtype(str(name))
        if dtype.hasobject:
            raise self.bad("holds numpy values of Python objects")
        return dtype

    def _ndarray(self, v: dict) -> np.ndarray:
        raw = self.tensor(v["k"]).numpy().tobytes()
        return np.frombuffer(raw, dtype=self._numpy_dtype(v["dtype"])).reshape(v["shape"]).copy()

    def _npscalar(self, v: dict) -> Any:
        return np.frombuffer(bytes.fromhex(v["hex"]), dtype=self._numpy_dtype(v["dtype"]))[0]

    def _dtype(self, v: dict) -> torch.dtype:
        dtype = getattr(torch, str(v["v"]), None)
        if not isinstance(dtype, torch.dtype):
            raise self.bad(f"names an unknown torch dtype {v['v']!r}")
        return dtype

    def _tensordict(self, v: dict) -> Any:
        from tensordict import TensorDict

        return TensorDict({k: self.decode(x) for k, x in v["v"].items()}, batch_size=v["batch_size"])

    def _object(self, v: dict) -> Any:
        cls = self.types.get(v["type"])
        if cls is None:
            raise CheckpointError(
                f"checkpoint part {self.where} holds a {v['type']}, which its reader does not accept (it accepts "
                f"{sorted(self.types) or 'no classes'}): resume with the DockFlow that wrote it"
            )
        fields = {k: self.decode(x) for k, x in v["v"].items()}
        if issubclass(cls, tuple):
            return cls(**fields)
        obj = cls.__new__(cls)  # as unpickling does: the fields as saved, no __init__ / __post_init__
        for k, x in fields.items():
            object.__setattr__(obj, k, x)
        return obj


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, dict, set)):
        raise CheckpointError(f"a checkpoint part holds an unhashable dict key or set item {key!r}")
    return key


def write_part_file(obj: Any, f: BinaryIO) -> None:
    """Write ``obj`` to ``f`` in the safetensors layout (header, then each tensor's bytes), streamed."""
    enc = _Encoder()
    tree = enc.encode(obj, "<part>")
    header: dict[str, Any] = {"__metadata__": {TREE_KEY: json.dumps(tree, allow_nan=True)}}
    offset = 0
    for key, t in enc.tensors.items():
        size = t.numel() * t.element_size()
        header[key] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for t in enc.tensors.values():
        if t.numel():
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def _read_exact(f: BinaryIO, n: int, where: str) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise CheckpointError(f"checkpoint part {where} ends early: it is truncated, resume from another checkpoint")
        got += k
    return buf


def read_part_file(source: Any, where: str, types: Iterable[type] = ()) -> Any:
    """The tree ``write_part_file`` wrote, from a path or an open binary file; only data is parsed."""
    with open(source, "rb") if isinstance(source, (str, Path)) else _borrowed(source) as f:
        (n,) = struct.unpack("<Q", bytes(_read_exact(f, 8, where)))
        if n > MAX_HEADER:
            raise CheckpointError(f"checkpoint part {where} is not a DockFlow part (a {n}-byte header): it was "
                                  "written by another program or an older DockFlow; resume from another checkpoint")
        try:
            header = json.loads(bytes(_read_exact(f, n, where)))
            tree = json.loads(header.pop("__metadata__")[TREE_KEY])
            entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint part {where} is not a DockFlow part ({exc}): resume from another "
                                  "checkpoint") from None
        tensors, offset = {}, 0
        for key, e in entries:
            try:
                tensors[key] = _tensor(f, e, offset, f"{where} (tensor {key})")
                offset = int(e["data_offsets"][1])
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise CheckpointError(f"checkpoint part {where} has a bad header entry for {key!r} ({exc}): resume "
                                      "from another checkpoint") from None
    return _Decoder(tensors, types, where).decode(tree)


def _tensor(f: BinaryIO, e: dict, offset: int, where: str) -> torch.Tensor:
    """One tensor of the data section, checked against its header entry (dtype, shape and offsets)."""
    dtype, shape, (begin, end) = BY_NAME.get(e["dtype"]), [int(s) for s in e["shape"]], e["data_offsets"]
    if dtype is None or begin != offset or min(shape, default=0) < 0:
        raise CheckpointError(f"checkpoint part {where} has a bad header entry {e}: resume from another checkpoint")
    size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if end - begin != size:
        raise CheckpointError(f"checkpoint part {where} holds {end - begin} bytes for shape {shape}: resume from "
                              "another checkpoint")
    if not size:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(_read_exact(f, size, where), dtype=torch.uint8).view(dtype).reshape(shape)


class _borrowed:
    """An open file used as a context manager without closing it (the store's fetch owns it)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def __enter__(self) -> BinaryIO:
        return self.f

    def __exit__(self, *exc: object) -> None:
        return None
