"""Config loading: the example YAML is complete, overrides apply, bad keys and values name themselves."""

from pathlib import Path

import pytest
import yaml

from dockflow.config import Config, ConfigError, load_config, parse_overrides
from dockflow.workers.resources import build_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "grpo_arith.yaml"


def test_example_config_loads_and_is_headed_by_its_command():
    cfg = load_config(EXAMPLE)
    assert cfg.global_batch == cfg.rollout.prompts_per_iter * cfg.rollout.group_size
    assert EXAMPLE.read_text().startswith("# Run: dockflow train configs/grpo_arith.yaml")


CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def _written_keys(raw: dict, prefix: str = "") -> set[str]:
    keys = set()
    for k, v in raw.items():
        keys |= _written_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return keys


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_example_config_writes_every_key_it_reads(path):
    """No hidden defaults: each example writes every key it reads (the algorithm section is its own algorithm's)."""
    raw = yaml.safe_load(path.read_text())
    cfg = Config.model_validate(raw)
    assert path.read_text().startswith(f"# Run: dockflow train configs/{path.name}")
    expected = set(cfg.flat())
    assert _written_keys(raw) == expected, f"missing {sorted(expected - _written_keys(raw))}"


def test_overrides_are_typed_and_nested():
    cfg = load_config(EXAMPLE, ["train.iterations=7", "rollout.temperature=0.5", "data.arithmetic.ops=[+]"])
    assert cfg.train.iterations == 7 and cfg.rollout.temperature == 0.5 and cfg.data.arithmetic.ops == ["+"]
    assert parse_overrides(["a.b=null"]) == {"a": {"b": None}}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.iteratons=3", "unknown config key 'train.iteratons' (did you mean 'train.iterations'?)"),
        ("rolout.temperature=1", "unknown config key 'rolout' (did you mean 'rollout'?)"),
        ("rollout.temperature=-1", "invalid value for 'rollout.temperature'"),
        ("train.iterations=many", "invalid value for 'train.iterations'"),
        ("noequals", "not of the form section.key=value"),
        ("train.micro_batch_size=3", "micro_batch_size=3 must divide"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(EXAMPLE, [override])
    assert message in str(err.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  name: x\n  seed 0\n  output_dir: runs\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    # PyYAML's 8-line scanner message becomes one line naming the file, the line and the column
    assert str(err.value) == (f"config file '{bad}' is not valid YAML at line 3, column 3: could not find "
                              "expected ':' (while scanning a simple key)")
    with pytest.raises(ConfigError, match=r"^override 'train.lr=\[1': the value is not valid YAML \(line 1, "):
        load_config(EXAMPLE, ["train.lr=[1"])


def test_defaults_equal_the_example_yaml():
    """No hidden defaults: a key left out of a config means what the example YAML says."""
    example = load_config(EXAMPLE).flat()
    defaults = Config().flat()
    # the example's own names, and its SFT floor and target (set by its task's plateau: no default fits every task)
    own = ("run.name", "registry.model_name", "sft.min_val_accuracy", "sft.target_val_accuracy")
    differ = {k: v for k, v in defaults.items() if example[k] != v and k not in own}
    assert differ == {}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.dp=2", "placement.mode=disaggregated"], "train.dp=2 .* placement.mode=disaggregated"),
        (["train.dp=2", "algorithm.name=dpo", "rollout.group_size=2", "train.mini_batch_size=64", "train.micro_batch_size=64"],
         "train.dp=2 .* algorithm.name=dpo"),
        (["train.dp=2", "engine.backend=cost_model"], "train.dp=2 .* engine.backend=cost_model"),
        (["train.dp=3"], r"train.dp=3 must divide train.mini_batch_size=256"),
        (["train.dp=0"], "invalid value for 'train.dp'"),
    ],
)
def test_data_parallel_constraints_name_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(EXAMPLE, overrides)
    assert load_config(EXAMPLE, ["train.dp=2"]).train.dp == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.tp=2"], "train.tp=2 / train.pp=1 split the model with megatron: set train.engine=megatron"),
        (["train.pp=2"], "train.tp=1 / train.pp=2 split the model with megatron"),
        (["train.engine=megatron", "train.tp=2", "train.dp=3"], "train.dp=3 must divide train.mini_batch_size"),
        (["train.engine=megatron", "train.tp=2", "engine.backend=vllm"],
         r"train.engine=megatron \(tp=2, pp=1, dp=1\) .* not with engine.backend=vllm"),
        (["train.engine=megatron", "train.pp=2", "train.dp=2", "placement.mode=disaggregated"],
         r"train.engine=megatron \(tp=1, pp=2, dp=2\) .* not with placement.mode=disaggregated"),
        (["train.engine=megatron", "train.tp=2", "train.pp=2", "rollout.prompts_per_iter=2", "rollout.group_size=128"],
         "its 4 actor ranks each generate for some prompts: rollout.prompts_per_iter must be >= it"),
        (["train.engine=mindspeed"], "invalid value for 'train.engine'"),
        (["train.tp=0"], "invalid value for 'train.tp'"),
        (["train.ep=2", "train.dp=2"], r"train.ep=2 splits the experts over megatron's data-parallel ranks: set "
                                       r"train.engine=megatron and a train.dp x train.tp \(2 x 1\) it divides"),
        (["train.engine=megatron", "train.ep=2"], r"a train.dp x train.tp \(1 x 1\) it divides"),
        (["train.engine=megatron", "train.ep=2", "train.dp=2"],
         r"train.ep=2 splits a mixture of experts, but model.tiny.architecture=qwen2 is dense: set it to qwen3_moe"),
        (["train.engine=megatron", "train.ep=3", "train.tp=3",
          "model.tiny.architecture=qwen3_moe"], r"train.ep=3 must divide the model's experts \(model.tiny.num_experts=8\)"),
        (["train.moe_aux_loss_coeff=0.01", "model.tiny.architecture=qwen3_moe"],
         r"train.moe_aux_loss_coeff=0.01 weighs megatron's load-balancing loss of a mixture of experts: set "
         r"train.engine=megatron"),
        (["train.moe_aux_loss_coeff=0.01", "train.engine=megatron"], r"train.moe_aux_loss_coeff=0.01 weighs"),
        (["train.moe_aux_loss_coeff=-1"], "invalid value for 'train.moe_aux_loss_coeff'"),
    ],
)
def test_megatron_layout_constraints_name_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(EXAMPLE, overrides)
    cfg = load_config(EXAMPLE, ["train.engine=megatron", "train.tp=2", "train.pp=2"])
    assert cfg.train.actor_ranks == 4 and build_plan(cfg).role("actor").count == 4
    cfg = load_config(EXAMPLE, ["train.engine=megatron", "train.tp=2", "train.dp=2"])  # 2 replicas of a TP=2 model
    assert cfg.train.actor_ranks == 4 and build_plan(cfg).role("actor").count == 4 and cfg.train.critic_ranks == 2
    assert load_config(EXAMPLE, []).train.engine == "fsdp"
    cfg = load_config(EXAMPLE, ["train.engine=megatron", "train.ep=2", "train.dp=2", "model.tiny.architecture=qwen3_moe"])
    assert cfg.train.ep == 2 and cfg.train.actor_ranks == 2  # EP ranks are DP ranks
    cfg = load_config(EXAMPLE, ["train.engine=megatron", "train.moe_aux_loss_coeff=0.01", "model.tiny.architecture=qwen3_moe"])
    assert cfg.train.moe_aux_loss_coeff == 0.01


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.group_size=4"], "set rollout.group_size: 2"),
        (["train.mini_batch_size=3", "train.micro_batch_size=3", "rollout.prompts_per_iter=3"], "must be even"),
        (["algorithm.name=pf_ppo", "rollout.group_size=2", "algorithm.pf_ppo.keep=3"], "pf_ppo.keep=3 must be at most"),
    ],
)
def test_algorithm_constraints_name_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / "configs" / "dpo_arith.yaml", overrides)
