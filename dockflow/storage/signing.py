"""The checkpoint key: an HMAC key held outside the bucket, which signs every manifest and is checked before any part
is read.

    key = checkpoint_key()      # bytes, or None when neither variable is set

Each process reads it from its own environment, like the S3 credentials, so it is never pickled with a store:
``DOCKFLOW_CHECKPOINT_KEY_FILE`` (a file holding the key, e.g. a mounted Kubernetes Secret), else
``DOCKFLOW_CHECKPOINT_KEY`` (the key itself). Every process that commits or reads a checkpoint (the driver, the
pipeline's tasks and every Ray worker) needs the same key. Without a key, manifests are unsigned and the sha256 of
each part only catches corruption: whoever can write the bucket can rewrite a part and its manifest alike.
"""

from __future__ import annotations

import os
from pathlib import Path

from dockflow.storage.manifest import CheckpointError

KEY_ENV = "DOCKFLOW_CHECKPOINT_KEY"
KEY_FILE_ENV = "DOCKFLOW_CHECKPOINT_KEY_FILE"
MIN_KEY_BYTES = 16


def checkpoint_key() -> bytes | None:
    """The checkpoint key of this process (see the module doc); a CheckpointError naming the variable when it is
    set but unusable."""
    path = os.environ.get(KEY_FILE_ENV)
    if path:
        try:
            key = Path(path).read_bytes().strip()
        except OSError as exc:
            raise CheckpointError(f"cannot read the checkpoint key file {KEY_FILE_ENV}={path} ({exc.strerror}): "
                                  "mount the Secret there, or unset it") from None
        where = f"the file {KEY_FILE_ENV}={path}"
    else:
        key = os.environ.get(KEY_ENV, "").strip().encode("utf-8")
        if not key:
            return None
        where = KEY_ENV
    if len(key) < MIN_KEY_BYTES:
        raise CheckpointError(f"the checkpoint key in {where} has {len(key)} bytes, fewer than {MIN_KEY_BYTES}: use "
                              "a random one, e.g. `openssl rand -hex 32`")
    return key
