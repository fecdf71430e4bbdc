"""The generate and infer coroutines of ``RunTasks`` with fake worker handles, driven by hand: under the plan's
sampling rounds generate scores each round, stops once the quota of groups has advantages (read from the
advantage call's ``RoundAdvantages``), and reports the selector's metrics; infer then scores nothing."""

from types import SimpleNamespace

from dockflow.algos.dapo import DynamicSampling
from dockflow.config import load_config
from dockflow.data.prompt_order import PromptSampler
from dockflow.flow.iteration import RunParts, RunTasks
from dockflow.flow.run_record import RunRecord
from dockflow.workers import Workers
from dockflow.workers.advantage import RoundAdvantages
from dockflow.workers.resources import build_plan

G, N = 4, 2


class Handle:
    """A fake actor method: ``.remote(*args)`` records the call and returns its name as the ref."""

    def __init__(self, calls: list, name: str) -> None:
        self.calls, self.name = calls, name

    def remote(self, *args):
        self.calls.append((self.name, args))
        return self.name


def _tasks(config: str, *extra: str) -> tuple[RunTasks, list]:
    cfg = load_config(config, [f"rollout.prompts_per_iter={G}", f"rollout.group_size={N}", "train.mini_batch_size=8",
                               "train.micro_batch_size=8", *extra])
    calls: list = []
    methods = ("generate", "compute_rewards", "compute_advantages", "compute_old_log_prob")
    handle = SimpleNamespace(**{m: Handle(calls, m) for m in methods})
    workers = Workers(actors=[handle], reward=handle)
    dock = SimpleNamespace(reset=lambda window: calls.append(("reset", window)))
    tracker = SimpleNamespace(log_metrics_or_defer=lambda metrics, step: True)
    sampler = PromptSampler(100, G * build_plan(cfg).sampling.rounds, 0)
    parts = RunParts(cfg=cfg, plan=build_plan(cfg), workers=workers, dock=dock, sampler=sampler, store=None, tracker=tracker, state=RunRecord())
    return RunTasks(parts, 0), calls


def _generated() -> dict[str, float]:
    return {"rollout/samples": float(G * N), "rollout/tokens": 16.0, "rollout/prompt_length": 1.0,
            "rollout/response_length": 1.0, "timing/generate_s": 1.0}


def _drive(task, answers):
    """Send each round's results to the coroutine; return the refs it asked for and its return value."""
    asked = [next(task)]
    try:
        for answer in answers:
            asked.append(task.send(answer))
    except StopIteration as stop:
        return asked, stop.value
    raise AssertionError("the coroutine asked for more rounds than answered")


def _round(kept: int, filled: int, mean: float) -> dict:
    adv = RoundAdvantages(kept=kept, filled=filled, metrics={"reward/zero_adv_group_fraction": 1 - mean})
    return {"generate": _generated(), "reward": {"reward/mean": mean}, "advantage": adv}


def test_rounds_stop_once_the_quota_has_advantages_and_report_the_selectors_metrics():
    tasks, calls = _tasks("configs/dapo_arith.yaml")  # max_rounds 3
    prompts = tasks.sampler.indices(0)
    asked, metrics = _drive(tasks.stage("generate", 0), [_round(3, 0, 0.25), _round(G, 0, 0.5)])
    assert [sorted(refs) for refs in asked] == [["advantage", "generate", "reward"]] * 2
    generated = [args for name, args in calls if name == "generate"]
    assert generated == [(0, prompts[:G], 0), (0, prompts[G:2 * G], G * N)]  # round r's prompts at slot r x G x N
    assert [args for name, args in calls if name == "compute_advantages"] == [(0, 0, False), (0, 1, False)]
    assert DynamicSampling().metrics(kept=G, filled=0, rounds=2).items() <= metrics.items()
    assert metrics["reward/mean"] == 0.5 and metrics["reward/zero_adv_group_fraction"] == 0.5  # the last round's
    assert metrics["rollout/samples"] == 2 * G * N

    calls.clear()
    asked, _ = _drive(tasks.stage("infer", 0), [{"old_log_prob": {"timing/old_log_prob_s": 1.0}}])
    assert [name for name, _ in calls] == ["compute_old_log_prob"]  # scored in generate already


def test_the_last_round_is_told_to_fill():
    tasks, calls = _tasks("configs/dapo_arith.yaml")
    _, metrics = _drive(tasks.stage("generate", 0), [_round(1, 0, 0.1), _round(2, 0, 0.1), _round(G, 2, 0.1)])
    assert [args[2] for name, args in calls if name == "compute_advantages"] == [False, False, True]
    assert DynamicSampling().metrics(kept=G, filled=2, rounds=3).items() <= metrics.items()


def test_one_round_scores_in_infer_and_merges_the_advantage_metrics():
    tasks, calls = _tasks("configs/grpo_arith.yaml")
    _, metrics = _drive(tasks.stage("generate", 0), [{"generate": _generated()}])
    assert set(DynamicSampling().metrics(kept=0, filled=0, rounds=0)).isdisjoint(metrics)
    adv = RoundAdvantages(kept=G, filled=0, metrics={"timing/advantage_s": 2.0})
    asked, metrics = _drive(tasks.stage("infer", 0), [{"reward": {"reward/mean": 1.0}, "advantage": adv,
                                                       "old_log_prob": {"timing/old_log_prob_s": 1.0}}])
    assert sorted(asked[0]) == ["advantage", "old_log_prob", "reward"]
    assert [args for name, args in calls if name == "compute_advantages"] == [(0, 0, True)]
    assert metrics == {"reward/mean": 1.0, "timing/old_log_prob_s": 1.0, "timing/advantage_s": 2.0}
