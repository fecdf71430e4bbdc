"""The pipeline tasks' pure parts: where they find the Ray cluster, and the overrides the parameters make."""

import pytest

from dockflow.flow.tasks import PipelineError, kfp_outputs, platform_overrides, ray_address


def test_ray_address_comes_from_the_parameter_then_the_env(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert ray_address("10.0.0.1:6379") == "10.0.0.1:6379"
    assert ray_address("") == "ray://head:10001"
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(PipelineError, match="RAY_ADDRESS"):
        ray_address("")


def test_platform_overrides(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert platform_overrides("", "", "", "") == []
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert platform_overrides("r1", "", "http://minio:9000", "ckpt") == [
        "run.name=r1", "tracking.uri=http://mlflow:5000", "checkpoint.s3_endpoint=http://minio:9000",
        "checkpoint.dir=s3://ckpt/r1",
    ]
    assert platform_overrides("r1", "http://other:5000", "", "")[1] == "tracking.uri=http://other:5000"
    with pytest.raises(PipelineError, match="s3_bucket needs run_name"):
        platform_overrides("", "", "", "ckpt")


def test_kfp_outputs_log_every_metric(tmp_path):
    from kfp.dsl import Metrics

    m = Metrics(name="metrics", uri=str(tmp_path / "metrics"), metadata={})
    out = kfp_outputs({"metrics": {"reward/mean": 0.5, "timing/generate_s": 2}, "mlflow_run_id": "abc",
                       "checkpoint_uri": "s3://b/r"}, m)
    assert out == ("abc", "s3://b/r") and m.metadata == {"reward/mean": 0.5, "timing/generate_s": 2.0}
