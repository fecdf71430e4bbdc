"""The prompt sampler is a pure function of the iteration: epochs are permutations, resume is exact."""

from dockflow.flow.sampler import PromptSampler


def test_each_epoch_visits_every_prompt_once():
    s = PromptSampler(num_prompts=10, per_iteration=4, seed=1)
    first_epoch = s.indices(0) + s.indices(1) + s.indices(2)[:2]
    assert sorted(first_epoch) == list(range(10))


def test_deterministic_and_seed_dependent():
    a, b = PromptSampler(100, 8, seed=0), PromptSampler(100, 8, seed=1)
    assert a.indices(5) == PromptSampler(100, 8, seed=0).indices(5)
    assert a.indices(5) != b.indices(5)
    assert a.position(3) == 24


def test_batch_larger_than_dataset_wraps_epochs():
    s = PromptSampler(num_prompts=3, per_iteration=7, seed=0)
    idx = s.indices(0)
    assert len(idx) == 7 and sorted(idx[:3]) == [0, 1, 2] and sorted(idx[3:6]) == [0, 1, 2]
