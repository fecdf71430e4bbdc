"""The pipeline tasks' pure parts: where they find the Ray cluster, the run's name, the overrides the run-time
parameters make, the KFP outputs, and the lines a stage task prints."""

import pytest

from dockflow.flow.pipeline_tasks import (
    PipelineError,
    RunParams,
    kfp_metrics,
    load_run_config,
    mlflow_link,
    progress_line,
    ray_address,
    run_name,
    run_report,
    worth_a_line,
)


def test_ray_address_comes_from_the_parameter_then_the_env(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert ray_address("10.0.0.1:6379") == "10.0.0.1:6379"
    assert ray_address("") == "ray://head:10001"
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(PipelineError, match="RAY_ADDRESS"):
        ray_address("")


def test_a_run_is_named_explicitly_or_after_its_kfp_run_id():
    assert run_name("nightly", "8f1c2d3e-aaaa-bbbb", "grpo_arith") == "nightly"
    assert run_name("", "8f1c2d3e-aaaa-bbbb-cccc", "grpo_arith") == "grpo_arith-8f1c2d3eaaaa"
    assert run_name("", "12345678", "grpo_arith") != run_name("", "87654321", "grpo_arith")
    with pytest.raises(PipelineError, match="run_name"):
        run_name("", "", "grpo_arith")


def test_run_time_parameters_become_overrides(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert RunParams(job_id="42").overrides("grpo_arith") == ["run.name=grpo_arith-42"]
    params = RunParams(run_name="r1", iterations=1000, max_staleness=1, eval_every=50, checkpoint_every=10,
                       continue_from="champion", s3_endpoint="http://minio:9000", s3_bucket="ckpt")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert params.overrides("x") == [
        "run.name=r1", "train.iterations=1000", "train.max_staleness=1", "eval.every=50", "checkpoint.every=10",
        "model.continue_from=champion", "tracking.uri=http://mlflow:5000", "checkpoint.s3_endpoint=http://minio:9000",
        "checkpoint.dir=s3://ckpt",
    ]
    cfg = load_run_config("configs/grpo_arith_async.yaml", ["run.name=base"], RunParams(job_id="77", iterations=3))
    assert cfg.run.name == "base-77" and cfg.train.iterations == 3 and cfg.train.max_staleness == 1


def test_kfp_metrics_log_every_metric(tmp_path):
    from kfp.dsl import Metrics

    m = Metrics(name="metrics", uri=str(tmp_path / "metrics"), metadata={})
    kfp_metrics({"reward/mean": 0.5, "timing/generate_s": 2}, m)
    assert m.metadata == {"reward/mean": 0.5, "timing/generate_s": 2.0}


def test_progress_lines_and_reports():
    status = {"iterations": 200}
    line = progress_line("generate", {"index": 11, "seconds": 0.4123, "metrics": {"rollout/response_length": 4.2}},
                         status)
    assert line == "generate: iteration 12/200 0.41s rollout/response_length=4.2"
    assert progress_line("evaluate", {"index": 100, "seconds": 3.0, "metrics": {}}, status).startswith(
        "evaluate: step 100/200")
    assert mlflow_link("http://mlflow:5000/", "3", "abc") == "[MLflow run abc](http://mlflow:5000/#/experiments/3/runs/abc)"
    assert "mlflow ui --backend-store-uri sqlite:///x.db" in mlflow_link("sqlite:///x.db", "1", "abc")
    summary = {"run_name": "r", "algorithm": "grpo", "accuracy_before": 0.4, "accuracy_after": 0.6, "iterations": 2,
               "samples_trained": 512, "throughput_tps": 10.0, "final_model": "s3://b/r/final_model",
               "registry": {"model_name": "m", "version": 3, "score": 0.6, "decision": "champion moved to 3"}}
    report = run_report(summary)
    assert "40.0%" in report and "60.0%" in report and "version 3" in report and "champion moved to 3" in report
    summary["evaluation"] = {"fingerprint": "9c0e1d2f3a4b5c6d"}
    summary["registry"]["compared"] = "v3 0.6 on evaluation 9c0e vs v1 0.5 on evaluation 9c0e (re-scored)"
    report = run_report(summary)
    assert "| evaluation fingerprint | `9c0e1d2f3a4b5c6d` |" in report
    assert "| compared | v3 0.6 on evaluation 9c0e vs v1 0.5 on evaluation 9c0e (re-scored) |" in report


def test_a_long_run_logs_about_a_hundred_lines_per_stage():
    assert sum(worth_a_line(i, 100_000) for i in range(100_000)) <= 112
    assert all(worth_a_line(i, 20) for i in range(20))
