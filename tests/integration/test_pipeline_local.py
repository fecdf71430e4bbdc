"""The KFP pipeline end to end under kfp.local: two DAPO iterations (dynamic sampling runs its rounds inside the
generate task) with max_staleness 1 (generation of the second iteration may run before the first one's update,
each in its own dock window); the same summary ``dockflow train`` writes, per-stage metrics of both iterations
in MLflow, and a policy whose every tensor changed."""

from pathlib import Path

from mlflow import MlflowClient
from safetensors.torch import load_file

from dockflow.config import load_config
from dockflow.storage import open_store
from dockflow.tracking import read_metric_history, resolve_tracking_uri
from pipelines.launch import options_for, run_local

CONFIG = "configs/dapo_arith.yaml"


def weights(model_dir: str):
    return load_file(str(Path(model_dir) / "model.safetensors"))


def test_two_iteration_pipeline_runs_locally(tiny_overrides):
    overrides = tiny_overrides("pipe", 2, train__max_staleness=1, eval__every=0, checkpoint__every=1,
                               dock__backend="centralized")  # one dock actor: the dock has its own tests
    cfg = load_config(CONFIG, overrides)
    summary = run_local(CONFIG, overrides, cfg, options_for(cfg))

    assert summary["iterations"] == 2 and summary["samples_trained"] == 2 * cfg.train_batch
    assert [e["iteration"] for e in summary["evals"]] == [0, 2]
    assert summary["throughput_tps"] > 0
    run_dir = Path(summary["final_model"]).parent
    assert (run_dir / "summary.json").is_file()
    before, after = weights(summary["initial_model"]), weights(summary["final_model"])
    unchanged = [k for k in before if (before[k] == after[k]).all()]
    assert not unchanged, f"unchanged tensors: {unchanged}"

    uri = resolve_tracking_uri(cfg.tracking.uri, run_dir)
    run_id = summary["mlflow_run_id"]
    for key in ("pipeline/generate_s", "pipeline/infer_s", "pipeline/update_s", "pipeline/reshard_s",
                "reward/mean", "train/pg_loss", "timing/old_log_prob_s", "perf/throughput_tps",
                "dapo/kept_groups", "dapo/rounds"):
        assert [s for s, _ in read_metric_history(uri, run_id, key)] == [1, 2], key
    assert [s for s, _ in read_metric_history(uri, run_id, "eval/test_accuracy")] == [0, 2]
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["driver"] == "kfp"
    assert open_store(cfg.checkpoint, run_dir).latest() == 2
