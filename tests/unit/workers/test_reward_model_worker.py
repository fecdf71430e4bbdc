"""The reward-model worker state without Ray: what it reads from the dock, what it writes, and which consumers
a config with ``reward.models`` registers."""

import pytest
import torch

from dockflow.config import ConfigError, load_config
from dockflow.dock import DockBatch, DockRequest
from dockflow.engines.token_layout import encode_rollouts
from dockflow.models import build_char_tokenizer
from dockflow.models.tiny_reward_model import build_tiny_reward_model
from dockflow.rewards.sequence_classifier import RewardModel
from dockflow.workers.resources import build_plan
from dockflow.workers.reward_model import RewardModelWorker
from dockflow.workers.run_dock import COLUMNS
from dockflow.workers.runtime import rng_state, set_rng_state

PROMPTS = ["What is 2 + 3?\nAnswer: ", "What is 2 + 3?\nAnswer: ", "What is 14 + 1?\nAnswer: ", "What is 14 + 1?\nAnswer: "]
RESPONSES = ["5", "six", "15", "fifteen, since 14 + 1 = 15"]


class FakeDock:
    """Hands out one fixed rollout batch in order, whatever the columns asked; records requests and puts."""

    def __init__(self, batch):
        self.batch, self.next, self.requests, self.puts = batch, 0, [], []

    def get(self, request: DockRequest) -> DockBatch:
        self.requests.append(request)
        lo, hi = self.next, self.next + request.batch_size
        self.next = hi
        prompt_id = torch.arange(lo, hi) // 2  # the dock's default: a group of 2 per prompt
        return DockBatch(list(range(lo, hi)), self.batch[lo:hi], meta={"prompt_id": prompt_id})

    def put(self, indices, data) -> None:
        self.puts.append((indices, data))


@pytest.fixture
def process_state():
    """The worker seeds this process's RNGs as a Ray worker would: give the other tests theirs back."""
    state, threads = rng_state(), torch.get_num_threads()
    yield
    set_rng_state(state)
    torch.set_num_threads(threads)


def _config(paths, **extra):
    models = ", ".join(f"{{path: {p}, name: rm{k}, weight: 0.5}}" for k, p in enumerate(paths))
    overrides = {"reward.models": f"[{models}]", "rollout.prompts_per_iter": 2, "rollout.group_size": 2,
                 "train.infer_batch_size": 3, "train.mini_batch_size": 4, "train.micro_batch_size": 2,
                 "ray.torch_threads": torch.get_num_threads(), **extra}
    return load_config("configs/grpo_arith.yaml", [f"{k}={v}" for k, v in overrides.items()])


def test_consumers_add_the_reward_model_state_and_make_the_reward_state_wait_for_its_scores(tmp_path):
    plain = load_config("configs/grpo_arith.yaml")
    assert "reward_model" not in build_plan(plain).consumers() and "rm_scores" not in build_plan(plain).consumers()["reward"]
    cfg = _config([tmp_path])
    assert build_plan(cfg).consumers()["reward_model"] == ["input_ids", "attention_mask", "responses", "response_mask"]
    assert build_plan(cfg).consumers()["reward"][-1] == "rm_scores" and COLUMNS["rm_scores"] == torch.float32
    with pytest.raises(ConfigError, match="dpo trains on offline pairs and scores nothing: set reward.models: "):
        load_config("configs/dpo_arith.yaml", [f"reward.models=[{{path: {tmp_path}}}]"])
    assert build_plan(cfg).model_cpus() == build_plan(plain).model_cpus() + cfg.reward.model_cpus  # its cores count in Eq. (5)'s ND


def test_the_worker_writes_each_models_score_of_the_decoded_prompt_and_response(tmp_path, process_state):
    rm_a = build_tiny_reward_model(tmp_path / "rm-a", seed=0)
    rm_b = build_tiny_reward_model(tmp_path / "rm-b", seed=1)
    # The policy's tokenizer differs from the reward models': the worker decodes with the policy's.
    policy_tok = build_char_tokenizer([p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)] * 3, num_merges=12)
    policy_tok.save_pretrained(tmp_path / "policy")
    cfg = _config([rm_a, rm_b])
    dock = FakeDock(encode_rollouts(policy_tok, PROMPTS, RESPONSES, response_width=32))

    metrics = RewardModelWorker(cfg, build_plan(cfg), str(tmp_path / "policy"), dock).score(iteration=0)

    assert [r.batch_size for r in dock.requests] == [3, 1] and {r.consumer for r in dock.requests} == {"reward_model"}
    assert dock.requests[0].window == build_plan(cfg).dock_window(0)
    assert dock.requests[0].columns == ("input_ids", "attention_mask", "responses", "response_mask")
    assert [i for indices, _ in dock.puts for i in indices] == [0, 1, 2, 3]
    written = torch.cat([data["rm_scores"] for _, data in dock.puts])
    assert written.shape == (4, 2) and written.dtype == torch.float32
    for m, path in enumerate((rm_a, rm_b)):
        expected = RewardModel(path, cfg.checkpoint).score(PROMPTS, RESPONSES)
        assert written[:, m].tolist() == pytest.approx(expected, abs=1e-5)
    assert not torch.allclose(written[:, 0], written[:, 1])
    assert metrics["timing/reward_model_s"] > 0


def test_a_chat_template_model_reads_the_tasks_own_prompt_and_a_plain_one_the_policys(tmp_path, process_state):
    from dockflow.data import load_task
    from dockflow.models.factory import save_pretrained_dir

    plain = build_tiny_reward_model(tmp_path / "rm-plain", seed=0)
    rm = RewardModel(plain, load_config("configs/grpo_arith.yaml").checkpoint)
    rm.tokenizer.chat_template = "{% for m in messages %}<bos>{{ m['role'] }}: {{ m['content'] }}<eos>{% endfor %}"
    chat = save_pretrained_dir(rm.model, rm.tokenizer, tmp_path / "rm-chat")
    policy_tok = build_char_tokenizer([p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)] * 3, num_merges=12)
    policy_tok.save_pretrained(tmp_path / "policy")
    cfg = _config([plain, chat], **{"data.system_prompt": "Be brief."})
    dock = FakeDock(encode_rollouts(policy_tok, PROMPTS, RESPONSES, response_width=32))

    RewardModelWorker(cfg, build_plan(cfg), str(tmp_path / "policy"), dock).score(iteration=0)

    written = torch.cat([data["rm_scores"] for _, data in dock.puts])
    own = [ex.prompt for ex in load_task(cfg.data, cfg.run.seed).train[:2] for _ in range(2)]
    assert own[0] != PROMPTS[0] and "Answer:" not in own[0]  # the task's prompt, not the policy's formatted one
    assert written[:, 0].tolist() == pytest.approx(RewardModel(plain, cfg.checkpoint).score(PROMPTS, RESPONSES), abs=1e-5)
    expected = RewardModel(chat, cfg.checkpoint, system_prompt="Be brief.").score(own, RESPONSES)
    assert written[:, 1].tolist() == pytest.approx(expected, abs=1e-5)
