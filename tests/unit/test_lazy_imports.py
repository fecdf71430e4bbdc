"""``dockflow.lazy_imports``: the Transformers modules that would import scikit-learn and SciPy at import bind
forwarders that give the same results (the fresh-process check that nothing imports them is in
``test_import_edges.py``, which runs one process already)."""

from __future__ import annotations

import importlib

import numpy as np

import dockflow.lazy_imports as lazy


def test_the_forwarders_give_what_the_functions_give() -> None:
    import scipy.optimize
    import sklearn.metrics
    import transformers.generation.candidate_generator as candidates
    import transformers.loss.loss_for_object_detection as detection

    labels, scores = np.array([0, 1, 1, 0, 1]), np.array([0.1, 0.8, 0.7, 0.3, 0.2])
    for got, want in zip(candidates.roc_curve(labels, scores), sklearn.metrics.roc_curve(labels, scores), strict=True):
        np.testing.assert_array_equal(got, want)
    cost = np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]])
    for got, want in zip(detection.linear_sum_assignment(cost), scipy.optimize.linear_sum_assignment(cost), strict=True):
        np.testing.assert_array_equal(got, want)
    assert candidates.is_sklearn_available() and detection.is_scipy_available()  # the real probes are back


def test_every_deferred_module_binds_its_names() -> None:
    for module, (probe, _, names) in lazy.DEFERRED.items():
        loaded = importlib.import_module(module)
        assert getattr(loaded, probe)(), module
        assert all(callable(getattr(loaded, name)) for name in names), module
