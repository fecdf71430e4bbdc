"""The Model Registry tests' fixtures: store, hf_dir, model_name (``tests/fixtures/mlflow_store.py``)."""

from fixtures.mlflow_store import hf_dir, model_name, store  # noqa: F401
