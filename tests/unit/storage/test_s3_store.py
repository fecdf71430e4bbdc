"""S3CheckpointStore against a real S3-protocol server (moto on loopback, authentication on): open_store
dispatch, multipart streaming, interrupted uploads, retries, and the one-line errors for bad credentials, a
missing bucket, an unreachable endpoint and a TLS mismatch. The interface tests shared with the local backend
are in test_checkpoint_store.py."""

from __future__ import annotations

import logging
import pickle
import time
from pathlib import Path

import pytest
import torch
from minio.error import ServerError
from urllib3.exceptions import ProtocolError

from dockflow.config import CheckpointConfig
from dockflow.storage import CheckpointError, S3CheckpointStore, open_store
from dockflow.storage.s3 import S3Options, load_credentials, parse_s3_url

QUICK = 10.0  # seconds within which every configuration error must be reported


def _open(url: str, tmp_path: Path, **cfg: object) -> S3CheckpointStore:
    store = open_store(CheckpointConfig(dir=url, **cfg), tmp_path)
    assert isinstance(store, S3CheckpointStore)
    return store


def _fails_quickly(url: str, tmp_path: Path, **cfg: object) -> str:
    t0 = time.monotonic()
    with pytest.raises(CheckpointError) as err:
        _open(url, tmp_path, **cfg)
    assert time.monotonic() - t0 < QUICK
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_round_trip_multipart_and_pickle(s3_checkpoint_dir: str, tmp_path: Path, s3_env) -> None:
    store = _open(s3_checkpoint_dir, tmp_path, keep=2)
    assert store.url == s3_checkpoint_dir and store.location(3) == f"{s3_checkpoint_dir}/step-000003"
    big = {"w": torch.arange(5_000_000, dtype=torch.float32)}  # 20 MB: a two-part multipart upload
    info = store.write_part(3, "actor", big)
    assert info.size > 16 << 20
    # The store travels to Ray actors by pickle: without client or keys; the copy builds its own client.
    blob = pickle.dumps(store)
    assert s3_env.secret_key.encode() not in blob and s3_env.access_key.encode() not in blob
    pickle.loads(blob).write_part(3, "driver", {"iteration": 3, "rng": torch.get_rng_state()})
    store.commit(3, {"iteration": 3})
    again = _open(s3_checkpoint_dir, tmp_path)  # a resumed run
    assert again.latest() == 3 and again.list_parts(3) == ["actor", "driver"]
    assert torch.equal(again.read_part(3, "actor")["w"], big["w"])
    assert again.read_part(3, "driver")["iteration"] == 3
    assert s3_env.secret_key not in repr(store) and s3_env.endpoint in repr(store)


def test_interrupted_upload_falls_back(
    s3_checkpoint_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = _open(s3_checkpoint_dir, tmp_path, keep=3, s3_attempts=1)
    store.write_part(1, "actor", {"w": torch.ones(3)})
    store.commit(1, {"iteration": 1})
    # Step 2: the actor part is uploaded, then the driver's upload dies in the middle of a multipart upload.
    store.write_part(2, "actor", {"w": torch.zeros(3)})
    real_upload = store._client._upload_part

    def dying_upload(*args: object, **kwargs: object) -> str:
        if args[-1] == 2:  # part number 2
            raise ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))
        return real_upload(*args, **kwargs)

    with (
        monkeypatch.context() as patch,
        pytest.raises(CheckpointError, match=r"S3 upload .*driver\.safetensors .* failed after 1 try"),
    ):
        patch.setattr(store._client, "_upload_part", dying_upload)
        store.write_part(2, "driver", {"w": torch.zeros(5_000_000)})
    assert sorted(store._list_files(2)) == ["actor.safetensors", "actor.safetensors.json"]  # the aborted upload left nothing
    with pytest.raises(CheckpointError, match=r"parts \['driver'\] were not written"):
        store.commit(2, {}, parts=["actor", "driver"])
    with caplog.at_level(logging.WARNING, logger="dockflow.storage"):
        assert _open(s3_checkpoint_dir, tmp_path).latest() == 1
    assert "step-000002" in caplog.text and "no manifest" in caplog.text


def test_transient_errors_are_retried(
    s3_checkpoint_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = _open(s3_checkpoint_dir, tmp_path, s3_backoff_s=0.01)
    calls = {"put": 0, "get": 0}
    real_put, real_get = store._client.put_object, store._client.get_object

    def flaky_put(*args: object, **kwargs: object) -> object:
        calls["put"] += 1
        if calls["put"] == 1:
            raise ServerError("server failed with HTTP status code 503", 503)
        return real_put(*args, **kwargs)

    def flaky_get(*args: object, **kwargs: object) -> object:
        calls["get"] += 1
        if calls["get"] == 1:
            raise ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))
        return real_get(*args, **kwargs)

    monkeypatch.setattr(store._client, "put_object", flaky_put)
    monkeypatch.setattr(store._client, "get_object", flaky_get)
    with caplog.at_level(logging.WARNING, logger="dockflow.storage"):
        store.write_part(4, "actor", {"w": torch.ones(4)})
        store.commit(4, {})
        assert torch.equal(store.read_part(4, "actor")["w"], torch.ones(4))
    assert "HTTP status code 503" in caplog.text and "try 2 of 4" in caplog.text
    assert "Connection reset by peer" in caplog.text
    # A permanent error is not retried.
    calls["put"] = 0
    monkeypatch.setattr(
        store._client, "put_object", lambda *a, **k: (calls.__setitem__("put", calls["put"] + 1), 1 / 0)
    )
    with pytest.raises(ZeroDivisionError):
        store.write_part(5, "actor", {})
    assert calls["put"] == 1


def test_bad_credentials(
    s3_checkpoint_dir: str, tmp_path: Path, s3_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-123")
    msg = _fails_quickly(s3_checkpoint_dir, tmp_path)
    assert (
        f"at {s3_env.endpoint} failed: the endpoint rejected the credentials from env AWS_ACCESS_KEY_ID/"
        in msg
    )
    assert "(SignatureDoesNotMatch): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in msg
    assert "not-the-secret-123" not in msg and s3_env.access_key not in msg
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    assert "(InvalidAccessKeyId)" in _fails_quickly(s3_checkpoint_dir, tmp_path)
    # (No credentials at all: MinIO and AWS answer AccessDenied, worded "no S3 credentials were found: set ...";
    # moto 5.2 answers an unsigned request with HTTP 500 instead, so that case is not run here.)


def test_credentials_from_secret_dir(s3_checkpoint_dir: str, tmp_path: Path, s3_env, monkeypatch) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "access-key").write_text(s3_env.access_key + "\n")
    (secret / "secret-key").write_text(s3_env.secret_key + "\n")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")  # the secret directory wins
    monkeypatch.setenv("DOCKFLOW_S3_SECRET_DIR", str(secret))
    creds = load_credentials()
    assert creds is not None and repr(creds) == f"Credentials(source='DOCKFLOW_S3_SECRET_DIR={secret}')"
    _open(s3_checkpoint_dir, tmp_path).write_part(1, "actor", {})
    (secret / "secret-key").unlink()
    with pytest.raises(
        CheckpointError, match=r"lacks the S3 keys: it needs a file named one of \['access-key'"
    ):
        load_credentials()
    monkeypatch.delenv("DOCKFLOW_S3_SECRET_DIR")
    env = {"MINIO_ROOT_USER": "u", "MINIO_ROOT_PASSWORD": "p"}
    assert load_credentials(env).source == "env MINIO_ROOT_USER/MINIO_ROOT_PASSWORD"  # type: ignore[union-attr]
    assert load_credentials({}) is None


def test_missing_bucket(s3_env, tmp_path: Path) -> None:
    url = "s3://no-such-bucket-here/run"
    msg = _fails_quickly(url, tmp_path)
    assert msg == (
        f"S3 bucket 'no-such-bucket-here' does not exist at {s3_env.endpoint}: create it (e.g. `mc mb "
        "<alias>/no-such-bucket-here`), set checkpoint.s3_create_bucket: true, or set checkpoint.dir to "
        "s3://<an existing bucket>/<prefix>"
    )
    store = _open("s3://created-by-dockflow/run", tmp_path, s3_create_bucket=True)
    store.write_part(0, "actor", {"w": torch.ones(1)})
    store.commit(0, {})
    assert _open("s3://created-by-dockflow/run", tmp_path).latest() == 0


def test_unreachable_endpoint(s3_env, tmp_path: Path) -> None:
    msg = _fails_quickly("s3://bucket/run", tmp_path, s3_endpoint="http://127.0.0.1:1", s3_backoff_s=0.1)
    assert msg.startswith("S3 list s3://bucket/run at http://127.0.0.1:1 failed after 4 tries in ")
    assert "Connection refused" in msg and "checkpoint.s3_endpoint (now from checkpoint.s3_endpoint)" in msg


def test_tls_to_a_plain_http_server(s3_env, tmp_path: Path) -> None:
    host_port = s3_env.endpoint.removeprefix("http://")
    msg = _fails_quickly("s3://dockflow-test/run", tmp_path, s3_endpoint=host_port)  # no scheme: TLS on
    assert f"at https://{host_port} failed: TLS failed" in msg and "set checkpoint.s3_secure: false" in msg
    assert _open("s3://dockflow-test/run", tmp_path, s3_endpoint=host_port, s3_secure=False).latest() is None


def test_urls_and_endpoints() -> None:
    assert parse_s3_url("s3://bucket") == ("bucket", "")
    assert parse_s3_url("s3://bucket/a/b/") == ("bucket", "a/b")
    with pytest.raises(CheckpointError, match="invalid bucket name 'B_'"):
        parse_s3_url("s3://B_/x")
    with pytest.raises(CheckpointError, match=r"has an empty, '\.' or '\.\.' segment"):
        parse_s3_url("s3://bucket/a//b")
    env = {"AWS_ENDPOINT_URL": "https://minio.example:9000", "AWS_DEFAULT_REGION": "eu-west-1"}
    opts = S3Options.from_config(CheckpointConfig(), env)
    assert (opts.endpoint, opts.secure, opts.region, opts.endpoint_source) == (
        "minio.example:9000",
        True,
        "eu-west-1",
        "env AWS_ENDPOINT_URL",
    )
    env["DOCKFLOW_S3_ENDPOINT"] = "http://minio.svc:9000"
    assert S3Options.from_config(CheckpointConfig(), env).endpoint_url == "http://minio.svc:9000"
    opts = S3Options.from_config(
        CheckpointConfig(s3_endpoint="minio:9000", s3_secure=False, s3_region="r"), env
    )
    assert (opts.endpoint_url, opts.region, opts.endpoint_source) == (
        "http://minio:9000",
        "r",
        "checkpoint.s3_endpoint",
    )
    assert S3Options.from_config(CheckpointConfig(), {}).endpoint_url == "https://s3.amazonaws.com"
    with pytest.raises(CheckpointError, match="must be host:port or http"):
        S3Options.from_config(CheckpointConfig(s3_endpoint="http://minio:9000/bucket"), {})
    with pytest.raises(CheckpointError, match=r"holds credentials \('\.\.\.@host'\)") as err:
        S3Options.from_config(CheckpointConfig(), {"DOCKFLOW_S3_ENDPOINT": "http://user:hunter2@minio:9000"})
    assert "hunter2" not in str(err.value)
