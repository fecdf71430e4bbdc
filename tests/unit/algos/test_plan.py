"""The run plan (``build_plan(cfg)``): for every example config, its workers (count, CPUs, devices), dock consumers and
Eq. 5's ND are what worker creation, the device check, the dock and the record computed from the config before
the plan existed (the oracles below), and the sections its roles carry are the algorithm's."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from dockflow.algos import recipe_of
from dockflow.algos.plan import REWARD_MODEL_CONSUMER, SNAPSHOT_CONSUMER
from dockflow.config import Config, load_config
from dockflow.config.algorithm import CriticSection, PreferenceSection
from dockflow.flow.iteration import RunParts, RunTasks
from dockflow.flow.run_checkpoint import stateful
from dockflow.workers import Workers
from dockflow.workers.cluster import local_inputs
from dockflow.workers.group import worker_cpus, worker_label
from dockflow.workers.resources import build_plan

CONFIGS = sorted(Path("configs").glob("*_arith.yaml"))
ROLLOUT = ["input_ids", "attention_mask", "responses", "response_mask"]


def _old_devices_per_worker(cfg: Config, label: str) -> float:
    role = label.split("-")[0] if not label.startswith("reward-model") else "reward-model"
    if cfg.engine.device == "cpu":
        return 0
    if role == "reward-model":
        return cfg.reward.model_devices
    if role not in ("actor", "generator", "reference", "critic"):
        return 0
    if role in ("actor", "generator") and cfg.engine.backend == "vllm":
        return int(cfg.engine.vllm.tensor_parallel_size)
    return 1


def _old_workers(cfg: Config) -> dict[str, tuple[float, float]]:
    """Actor label -> (CPUs, devices) as ``create_workers`` started them from the config and the recipe."""
    recipe, ray, placement = recipe_of(cfg.algorithm.name), cfg.ray, cfg.placement
    cpus = {f"actor-{k}" if k else "actor": ray.actor_cpus / cfg.train.dp for k in range(cfg.train.dp)}  # shared
    if not recipe.offline:
        cpus["reward"] = 0
    if recipe.uses_reference(cfg):
        cpus["reference"] = ray.reference_cpus
    if recipe.critic:
        cpus["critic"] = ray.critic_cpus
    if recipe.offline:
        cpus["pairs"] = 0
    generators = placement.generators if placement.mode == "disaggregated" else 0
    cpus.update({f"generator-{k}": placement.generator_cpus for k in range(generators)})
    if generators > 1:
        cpus["rollout-queue"] = 0
    if cfg.reward.models and not recipe.offline:
        cpus["reward-model"] = cfg.reward.model_cpus
    return {label: (c, _old_devices_per_worker(cfg, label)) for label, c in cpus.items()}


def _old_consumers(cfg: Config) -> dict[str, list[str]]:
    """The dock's consumers as the dock registered them from the config: the recipe's states, the reward
    model's, the snapshot."""
    out = recipe_of(cfg.algorithm.name).consumers(cfg)
    if cfg.reward.models and "reward" in out:
        out[REWARD_MODEL_CONSUMER] = list(ROLLOUT)
        out["reward"] = [*out["reward"], "rm_scores"]
    if cfg.placement.mode == "disaggregated" and cfg.train.max_staleness > 0:
        generated = [*ROLLOUT, "rollout_log_prob"] + (["old_log_prob"] if cfg.train.old_log_prob == "rollout" else [])
        out[SNAPSHOT_CONSUMER] = generated
    return out


def _old_nd(cfg: Config) -> float:
    """ND of Eq. (5) as the record summed it from the config: the model workers' CPUs (the actor's whole, shared
    by its ranks)."""
    ray, placement, recipe = cfg.ray, cfg.placement, recipe_of(cfg.algorithm.name)
    generators = placement.generators * placement.generator_cpus if placement.mode == "disaggregated" else 0.0
    return (ray.actor_cpus + (ray.reference_cpus if recipe.uses_reference(cfg) else 0.0)
            + (ray.critic_cpus if recipe.critic else 0.0)
            + (cfg.reward.model_cpus if cfg.reward.models and not recipe.offline else 0.0) + generators)


def _variants(path: Path, rm: Path) -> list[list[str]]:
    name = load_config(path).algorithm.name
    out = [[], ["engine.device=cuda", "engine.backend=vllm", "engine.vllm.tensor_parallel_size=2",
                "ray.reference_cpus=0.5", "ray.critic_cpus=0.25"]]
    if name != "dpo":  # offline pairs: no reward models, no generators, one actor rank
        out.append(["engine.device=cuda", "train.dp=2", "ray.actor_cpus=0.5"])
        out.append([f"reward.models=[{{path: {rm}}}]", "reward.model_cpus=0.5", "engine.device=npu",
                    "reward.model_devices=0.5", "train.old_log_prob=rollout", "algorithm.kl_coef=0.1"])
    if name not in ("dpo", "dapo"):  # DAPO samples in rounds: not disaggregated
        out.append(["placement.mode=disaggregated", "placement.generators=2", "placement.generator_cpus=0.5",
                    "train.max_staleness=1"])
        out.append(["placement.mode=disaggregated", "placement.generators=1", "train.max_staleness=0",
                    "engine.device=cuda"])
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_the_plan_has_the_workers_and_consumers_the_config_had(path, tmp_path):
    for overrides in _variants(path, tmp_path):
        cfg = load_config(path, overrides)
        plan = build_plan(cfg)
        planned = {worker_label(r.name, k): (r.cpus, r.devices) for r in plan.roles.values() for k in range(r.count)}
        assert planned == _old_workers(cfg), overrides
        assert worker_cpus(plan) == {label: c for label, (c, _) in _old_workers(cfg).items()}
        assert plan.consumers() == _old_consumers(cfg), overrides
        assert plan.model_cpus() == _old_nd(cfg), overrides
        old_devices = {}
        for label, (_, d) in _old_workers(cfg).items():
            role = "reward_model" if label == "reward-model" else label.split("-")[0]
            old_devices[role] = old_devices.get(role, 0) + d
        assert plan.devices() == {r: d for r, d in old_devices.items() if d}, overrides


def test_each_algorithm_plans_its_own_roles(tmp_path):
    ppo = build_plan(load_config("configs/ppo_arith.yaml"))
    critic = ppo.role("critic")
    assert (critic.count, critic.cpus, critic.devices) == (1, load_config("configs/ppo_arith.yaml").ray.critic_cpus, 0)
    assert set(critic.reads) == {"critic_infer", "critic_update"} and critic.writes == ("values",)
    assert "returns" in ppo.role("reward").writes and not ppo.has("reference") and not ppo.has("pairs")
    dpo = build_plan(load_config("configs/dpo_arith.yaml"))
    assert set(dpo.roles) == {"actor", "reference", "pairs"} and set(dpo.consumers()) == {"ref_infer", "actor_update"}
    assert dpo.role("pairs").writes == tuple(ROLLOUT) and not dpo.has("reward")
    grpo = build_plan(load_config("configs/grpo_arith.yaml"))
    assert set(grpo.roles) == {"actor", "reward"} and grpo.model_cpus() == grpo.role("actor").cpus
    with pytest.raises(KeyError, match="this run has no 'critic' worker"):
        grpo.role("critic")


def test_generators_a_rollout_queue_and_the_snapshot_come_with_disaggregated_placement():
    two = load_config("configs/grpo_arith_async.yaml", ["placement.generators=2"])
    plan = build_plan(two)
    assert plan.role("generator").count == 2 and plan.has("rollout_queue")
    assert plan.role("rollout_queue").cpus == 0 and plan.role("rollout_queue").devices == 0
    assert plan.consumers()[SNAPSHOT_CONSUMER] == [*ROLLOUT, "rollout_log_prob"]
    assert "rollout_log_prob" in plan.role("generator").writes and "responses" not in plan.role("actor").writes
    assert [worker_label("generator", k) for k in range(2)] == ["generator-0", "generator-1"]
    one = build_plan(load_config("configs/grpo_arith_async.yaml", ["placement.generators=1"]))
    assert not one.has("rollout_queue") and SNAPSHOT_CONSUMER in one.consumers()
    sync = build_plan(load_config("configs/grpo_arith_async.yaml", ["train.max_staleness=0"]))
    assert SNAPSHOT_CONSUMER not in sync.consumers()
    assert not build_plan(load_config("configs/grpo_arith.yaml")).has("generator")


def test_reward_models_add_their_worker_and_make_the_reward_state_wait(tmp_path):
    cfg = load_config("configs/grpo_arith.yaml", [f"reward.models=[{{path: {tmp_path}}}]"])
    plan = build_plan(cfg)
    assert plan.role("reward_model").reads == {REWARD_MODEL_CONSUMER: tuple(ROLLOUT)}
    assert plan.role("reward").reads["reward"][-1] == "rm_scores" and plan.role("reward_model").writes == ("rm_scores",)
    assert worker_label("reward_model", 0) == "reward-model" and worker_cpus(plan)["reward-model"] == cfg.reward.model_cpus


def test_vllm_tensor_parallelism_gives_the_generating_workers_its_devices():
    cfg = load_config("configs/ppo_arith.yaml", ["engine.device=cuda", "engine.backend=vllm",
                                                 "engine.vllm.tensor_parallel_size=2"])
    assert build_plan(cfg).role("actor").devices == 2 and build_plan(cfg).role("critic").devices == 1
    assert build_plan(cfg).devices() == {"actor": 2, "critic": 1}


def test_roles_carry_the_algorithms_sections_with_their_key_paths(tmp_path):
    for name in ("ppo", "pf_ppo"):
        cfg = load_config(f"configs/{name}_arith.yaml", ["algorithm.ppo.critic_lr=0.002"])
        section = build_plan(cfg).section("critic", CriticSection)
        assert section == cfg.algorithm.ppo and section.critic_lr == 0.002
        assert section.key_of("value_clip") == "algorithm.ppo.value_clip"
    pairs_file = tmp_path / "prefs.jsonl"
    dpo = load_config("configs/dpo_arith.yaml", [f"algorithm.dpo.pairs_path={pairs_file}"])
    pairs = build_plan(dpo).section("pairs", PreferenceSection)
    assert pairs == dpo.algorithm.dpo and pairs.key_of("pairs_path") == "algorithm.dpo.pairs_path"
    assert local_inputs(dpo, build_plan(dpo))["algorithm.dpo.pairs_path"] == str(pairs_file)
    grpo_cfg = load_config("configs/grpo_arith.yaml")
    assert not any("pairs_path" in k for k in local_inputs(grpo_cfg, build_plan(grpo_cfg)))
    with pytest.raises(TypeError, match="the critic worker reads PPOConfig, not PreferenceSection"):
        build_plan(load_config("configs/ppo_arith.yaml")).section("critic", PreferenceSection)


def test_megatron_gives_the_critic_tp_x_pp_ranks_and_the_stages_call_each():
    cfg = load_config("configs/ppo_arith.yaml", ["train.engine=megatron", "train.tp=2", "train.pp=2"])
    critic = build_plan(cfg).role("critic")
    assert critic.count == cfg.train.critic_ranks == 4 and build_plan(cfg).role("actor").count == 4
    assert [w for w in worker_cpus(build_plan(cfg)) if w.startswith("critic")] == ["critic", "critic-1", "critic-2", "critic-3"]
    assert build_plan(cfg).model_cpus() == cfg.ray.actor_cpus + cfg.ray.critic_cpus  # each shared by its 4 ranks
    assert set(worker_cpus(build_plan(cfg)).values()) >= {cfg.ray.actor_cpus / 4, cfg.ray.critic_cpus / 4}
    assert build_plan(load_config("configs/ppo_arith.yaml")).role("critic").count == 1  # fsdp: one torch critic

    class Rank:  # a worker handle: ``method.remote(*args)`` -> (rank, method, args)
        def __init__(self, k: int):
            self.k = k

        def __getattr__(self, method: str):
            return SimpleNamespace(remote=lambda *args: (self.k, method, args))

    critics = [Rank(k) for k in range(4)]
    workers = Workers(actors=[Rank(0)], critics=critics)
    assert stateful(workers).keys() == {"actor", "critic", "critic-1", "critic-2", "critic-3"}

    def asked(stage: str, on: Workers) -> dict:  # the refs a stage's work sends first
        parts = RunParts(cfg=cfg, plan=build_plan(cfg), workers=on, dock=None, sampler=None, store=None, tracker=None,
                         state=None)
        return next(RunTasks(parts, 0).stage(stage, 3))

    refs = asked("update", workers)
    assert {k: v for k, v in refs.items() if k.startswith("critic")} == {
        "critic_update": (0, "update", (3,)), **{f"critic_update/{k}": (k, "update", (3,)) for k in (1, 2, 3)}}
    assert asked("infer", workers)["values/2"] == (2, "compute_values", (3,))
    assert "values" not in asked("infer", Workers(actors=[Rank(0)]))  # no critic, no critic calls


def test_only_the_drivers_build_the_run_plan():
    """The plan is a value: the drivers build it once (``build_plan``) and pass it to the session, the workers and
    the flow; no worker or stage rebuilds it."""
    import ast

    root = Path(__file__).resolve().parents[3] / "dockflow"
    drivers = {"flow/trainer.py", "flow/supervisor.py", "flow/pipeline_tasks.py", "workers/resources.py",
               "flow/single_process.py"}  # the single-process loop is its own driver
    builders = []
    for path in sorted([*(root / "flow").rglob("*.py"), *(root / "workers").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("build_plan", "plan_roles") or (name == "plan" and isinstance(node.func, ast.Attribute)):
                    builders.append(path.relative_to(root).as_posix())
    assert set(builders) <= drivers and builders.count("flow/trainer.py") == 1, builders


def test_with_lora_the_actor_ranks_are_the_reference_and_the_infer_stage_asks_them():
    """``model.lora`` with a KL term: no reference worker; the actor ranks own ``ref_infer`` (the reference's columns)
    and write ``ref_log_prob`` from their base model, the adapter off."""
    cfg = load_config("configs/grpo_arith_lora.yaml", ["train.dp=2"])
    plan, full = build_plan(cfg), build_plan(load_config("configs/grpo_arith_lora.yaml", ["model.lora=null"]))
    assert plan.reference_in_actor and not full.reference_in_actor
    assert not plan.has("reference") and full.role("reference").reads["ref_infer"] == plan.role("actor").reads["ref_infer"]
    assert "ref_log_prob" in plan.role("actor").writes and plan.consumers() == full.consumers()
    assert plan.model_cpus() == full.model_cpus() - cfg.ray.reference_cpus
    assert not build_plan(load_config("configs/grpo_arith_lora.yaml", ["algorithm.kl_coef=0"])).reference_in_actor

    class Rank:  # a worker handle: ``method.remote(*args)`` -> (rank, method, args)
        def __init__(self, k: int):
            self.k = k

        def __getattr__(self, method: str):
            return SimpleNamespace(remote=lambda *args: (self.k, method, args))

    parts = RunParts(cfg=cfg, plan=plan, workers=Workers(actors=[Rank(0), Rank(1)]), dock=None, sampler=None,
                     store=None, tracker=None, state=None)
    refs = next(RunTasks(parts, 0).stage("infer", 3))
    assert refs["ref_log_prob"] == (0, "compute_ref_log_prob", (3,))
    assert refs["ref_log_prob/1"] == (1, "compute_ref_log_prob", (3,))
