"""Ray token auth settings (``dockflow.workers.ray_auth``) on a plain dict as the environment: the local cluster's
own token, the user's token kept, the opt-out kept, the join's mode, a bad token file, and the one-line answers
to a refused token (the refusal itself is faked here; tests/integration/test_ray_token_auth.py asks a real cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dockflow.workers import ray_auth


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment whose home has no ~/.ray/auth_token."""
    return {"HOME": str(tmp_path)}


def test_a_local_cluster_gets_a_random_token_of_its_own(home: dict[str, str]) -> None:
    first, second = dict(home), dict(home)
    assert ray_auth.prepare_local_cluster(first) == "token" == ray_auth.prepare_local_cluster(second)
    assert first["RAY_AUTH_MODE"] == "token"
    assert len(first["RAY_AUTH_TOKEN"]) == 64 and int(first["RAY_AUTH_TOKEN"], 16) >= 0  # 256 bits, hex
    assert first["RAY_AUTH_TOKEN"] != second["RAY_AUTH_TOKEN"]


def test_the_users_token_and_opt_out_are_kept(home: dict[str, str], tmp_path: Path) -> None:
    given = {**home, "RAY_AUTH_TOKEN": "users-token"}
    ray_auth.prepare_local_cluster(given)
    assert given["RAY_AUTH_TOKEN"] == "users-token"
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    by_file = {**home, "RAY_AUTH_TOKEN_PATH": str(token_file)}
    ray_auth.prepare_local_cluster(by_file)
    assert "RAY_AUTH_TOKEN" not in by_file and by_file["RAY_AUTH_MODE"] == "token"
    off = {**home, "RAY_AUTH_MODE": "disabled"}
    assert ray_auth.prepare_local_cluster(off) == "disabled"
    assert "RAY_AUTH_TOKEN" not in off


def test_joining_turns_token_mode_on_only_when_a_token_is_given(home: dict[str, str], tmp_path: Path) -> None:
    none = dict(home)
    ray_auth.prepare_join(none)
    assert "RAY_AUTH_MODE" not in none  # Ray's default (disabled) for an explicit address
    given = {**home, "RAY_AUTH_TOKEN": "t"}
    ray_auth.prepare_join(given)
    assert given["RAY_AUTH_MODE"] == "token"
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t")
    default_file = dict(home)
    assert ray_auth.token_source(default_file) == "~/.ray/auth_token"
    ray_auth.prepare_join(default_file)
    assert default_file["RAY_AUTH_MODE"] == "token"
    kept = {**home, "RAY_AUTH_TOKEN": "t", "RAY_AUTH_MODE": "disabled"}
    ray_auth.prepare_join(kept)
    assert kept["RAY_AUTH_MODE"] == "disabled"


@pytest.mark.parametrize("content", [None, ""])
def test_a_token_path_without_a_token_is_one_line(home: dict[str, str], tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    for prepare in (ray_auth.prepare_local_cluster, ray_auth.prepare_join):
        with pytest.raises(ray_auth.RayAuthError, match=r"^RAY_AUTH_TOKEN_PATH='.*token' (cannot be read|is empty)"):
            prepare({**home, "RAY_AUTH_TOKEN_PATH": str(path)})


def test_a_refused_token_says_what_to_set(home: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_auth, "_gcs_refused", lambda address: True)
    monkeypatch.setattr(ray_auth, "_client_refused", lambda address, timeout_s: True)
    none = ray_auth.refused_token("10.0.0.1:6379", dict(home))
    assert none.startswith("the Ray cluster at ray.address='10.0.0.1:6379' requires a token") and "\n" not in none
    assert "set RAY_AUTH_TOKEN" in none and "Secret dockflow-ray" in none
    wrong = ray_auth.refused_token("ray://head:10001", {**home, "RAY_AUTH_TOKEN": "s3cr3t-value", "RAY_AUTH_MODE": "token"})
    assert wrong.startswith("the Ray cluster at ray.address='ray://head:10001' refused the token from RAY_AUTH_TOKEN")
    assert "s3cr3t-value" not in wrong
    disabled = ray_auth.refused_token("10.0.0.1:6379", {**home, "RAY_AUTH_TOKEN": "t", "RAY_AUTH_MODE": "disabled"})
    assert "RAY_AUTH_MODE=disabled here" in disabled
    monkeypatch.setattr(ray_auth, "_gcs_refused", lambda address: False)
    assert ray_auth.refused_token("10.0.0.1:6379", dict(home)) is None
