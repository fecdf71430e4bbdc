"""The prompt sampler is a pure function of the iteration: epochs are permutations, resume is exact."""

from dockflow.data.prompt_order import PromptSampler


def test_each_epoch_visits_every_prompt_once():
    s = PromptSampler(num_prompts=10, per_iteration=4, seed=1)
    first_epoch = s.indices(0) + s.indices(1) + s.indices(2)[:2]
    assert sorted(first_epoch) == list(range(10))


def test_deterministic_and_seed_dependent():
    a, b = PromptSampler(100, 8, seed=0), PromptSampler(100, 8, seed=1)
    assert a.indices(5) == PromptSampler(100, 8, seed=0).indices(5)
    assert a.indices(5) != b.indices(5)


def test_batch_larger_than_dataset_wraps_epochs():
    s = PromptSampler(num_prompts=3, per_iteration=7, seed=0)
    idx = s.indices(0)
    assert len(idx) == 7 and sorted(idx[:3]) == [0, 1, 2] and sorted(idx[3:6]) == [0, 1, 2]


def test_recurring_runs_draw_prompts_in_their_own_order_and_a_resumed_run_in_the_same():
    from dockflow.config import load_config
    from dockflow.rollout.prompts import shuffle_seed

    base = load_config("configs/grpo_arith.yaml")
    assert shuffle_seed(base) == base.run.seed
    night = ["model.continue_from=champion", "run.name=grpo_arith-0a1b2c"]
    first, again = load_config("configs/grpo_arith.yaml", night), load_config("configs/grpo_arith.yaml", night)
    other = load_config("configs/grpo_arith.yaml", ["model.continue_from=champion", "run.name=grpo_arith-ffee00"])
    assert shuffle_seed(first) == shuffle_seed(again) != shuffle_seed(other)
    fixed = load_config("configs/grpo_arith.yaml", [*night, "data.shuffle_seed=7"])
    assert shuffle_seed(fixed) == 7
