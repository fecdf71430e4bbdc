import torch
from tensordict import TensorDict

from dockflow.workers.staleness import StalenessCounter


def batch(n: int) -> TensorDict:
    return TensorDict({"response_mask": torch.ones(n, 3, dtype=torch.long)}, batch_size=[n])


def test_ages_within_the_bound_pass_unchanged_and_are_counted():
    counter = StalenessCounter(version=5, bound=1)
    data = batch(4)
    out = counter.admit(data, torch.tensor([5, 4, 4, -1]))  # -1: offline data, no age
    assert out is data and int(out["response_mask"].sum()) == 12
    assert counter.metrics() == {"staleness/mean": 2 / 3, "staleness/max": 1.0, "staleness/dropped": 0.0,
                                 "staleness/age_0": 1.0, "staleness/age_1": 2.0}


def test_samples_past_the_bound_are_masked_out_of_the_loss_and_counted():
    counter = StalenessCounter(version=5, bound=1)
    data = batch(3)
    out = counter.admit(data, torch.tensor([5, 3, 2]))
    assert out["response_mask"].sum(dim=1).tolist() == [3, 0, 0]
    assert int(data["response_mask"].sum()) == 9  # the dock's batch itself is left alone
    metrics = counter.metrics()
    assert metrics["staleness/dropped"] == 2 and metrics["staleness/max"] == 3
