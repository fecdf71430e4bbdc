"""``MegatronCriticEngine`` (the value model: the GPTModel trunk, a scalar head for ``output_layer``) on two gloo
ranks at TP=2 and at PP=2, against ``TorchTrainingEngine`` with ``response_values`` (the torch critic) on the same HF
critic: values before and after one update with PPO's clipped value loss (2 micro-batches, clipping of the values
and of the grad norm that both bite, AdamW with weight decay) agree within 1e-5, the gradients (AdamW's first
moments) within float32 rounding and the updated weights (gathered, HF critic names) within what that rounding can
change in one AdamW step (``fixtures/tolerances.py``), and so do the grad norm and the loss; the HF <-> megatron critic conversion round-trips exactly;
the layout-free ``state_dict`` reloads and resumes bit-exactly and ``save_pretrained`` writes the HF critic. The run
checkpoint (``save_state``: each rank's shards through ``dist_checkpointing``, as the policy's) resumes bit-exactly
at the same layout, and the TP=2 one loads at PP=2 (TP=1) with the same weights and AdamW moments.

megatron is imported once, in the fork server the ranks start from (``tests/fixtures/ranks.py``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fixtures.engine_batches import critic_batch, value_loss
from fixtures.ranks import start_ranks
from fixtures.tiny_models import tiny_decoder
from fixtures.tolerances import assert_first_step_close, assert_grads_close, first_step_grads, grad_tolerance
from torch import nn

from dockflow.engines.logprobs import response_values
from dockflow.engines.torch_training import TorchTrainingEngine
from dockflow.models import build_char_tokenizer, load_critic, save_pretrained_dir
from dockflow.storage import LocalCheckpointStore

NAME = "qwen2_tied"  # the policy's tied embedding is the trunk's input embedding only
ENGINE_ARGS = dict(lr=1e-3, weight_decay=0.1, grad_clip=0.5, infer_batch_size=3)


def make_critic(policy: Path) -> nn.Module:
    """The policy's critic (``load_critic``) given a non-zero head: a zero head passes no grad to the trunk."""
    critic = load_critic(policy)
    with torch.no_grad():
        critic.score.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(5))
    return critic


def _one_update(engine) -> dict:
    values = engine.infer(critic_batch())
    batch = critic_batch(values)
    metrics = engine.train_mini_batch(batch, value_loss, micro_batch_size=2)
    return {"values": values, "metrics": metrics, "weights": {n: w.clone() for n, w in engine.named_weights()},
            "values_after": engine.infer(batch), "mask": batch["response_mask"],
            "grads": first_step_grads(_first_moments(engine))}


def _first_moments(engine) -> dict[str, torch.Tensor]:
    """AdamW's first moments by HF name: the torch engine's by parameter, megatron's from its layout-free state."""
    if isinstance(engine, TorchTrainingEngine):
        return {n: engine.optimizer.state[p]["exp_avg"] for n, p in engine.model.named_parameters()}
    return engine.state_dict()["optimizer"]["exp_avg"]


def _rank(rank: int, layout: tuple[int, int], tmp: str) -> None:
    from dockflow.engines.megatron import model as mg
    from dockflow.engines.megatron.value import MegatronCriticEngine, critic_to_megatron, megatron_to_critic

    torch.set_num_threads(1)
    store = dist.FileStore(str(Path(tmp) / "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    tp, pp = layout
    engine = MegatronCriticEngine(make_critic(Path(tmp) / "policy"), tp=tp, pp=pp, **ENGINE_ARGS)
    out = _one_update(engine)
    state = engine.state_dict()
    hf = state["model"]
    ckpt = LocalCheckpointStore(Path(tmp) / "ckpt", keep=2)
    out["saved"] = engine.save_state(ckpt, 1, "critic")  # the run checkpoint: each rank's shards
    out["parts"] = sorted(ckpt.commit(1, {"iteration": 1}).parts) if rank == 0 else None
    batch = critic_batch(out["values"])
    engine.train_mini_batch(batch, value_loss, micro_batch_size=2)
    second = {n: w.clone() for n, w in engine.named_weights()}
    for reload in (lambda: engine.load_state_dict(state), lambda: engine.load_state(ckpt, 1, "critic", out["saved"])):
        reload()  # each rank takes its shards of the layout-free state, or of the dist checkpoint, back
        out.setdefault("reloaded_equal", []).append(all(torch.equal(w, hf[n]) for n, w in engine.named_weights()))
        engine.train_mini_batch(batch, value_loss, micro_batch_size=2)
        out.setdefault("resumed_equal", []).append(all(torch.equal(w, second[n]) for n, w in engine.named_weights()))
    out["second"] = second
    engine.save_pretrained(Path(tmp) / "saved")  # the HF critic, gathered after the resumed update
    out["round_trip"] = all(torch.equal(t, hf[n]) for n, t in megatron_to_critic(critic_to_megatron(
        hf, engine.spec), engine.spec).items()) and len(hf) == len(megatron_to_critic(
        critic_to_megatron(hf, engine.spec), engine.spec))
    if layout == (2, 1):  # the TP=2 checkpoint at PP=2: every weight and moment as saved
        mg.destroy_model_parallel()
        other = MegatronCriticEngine(make_critic(Path(tmp) / "policy"), tp=1, pp=2, **ENGINE_ARGS)
        other.load_state(ckpt, 1, "critic", out["saved"])
        out["at_pp2"] = other.state_dict()
        out["state"] = state
    out["layout"] = layout
    torch.save(out, Path(tmp) / f"rank{rank}.pt")
    dist.barrier()
    mg.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[(2, 1), (1, 2)], ids=["tp2", "pp2"])
def runs(request, tmp_path_factory) -> tuple[list[dict], dict, dict, Path]:
    tmp = tmp_path_factory.mktemp("megatron_critic")
    save_pretrained_dir(tiny_decoder(NAME), build_char_tokenizer(), tmp / "policy")
    start = make_critic(tmp / "policy").state_dict()
    reference = _one_update(TorchTrainingEngine(make_critic(tmp / "policy"), response_fn=response_values,
                                                **ENGINE_ARGS))
    start_ranks(_rank, (request.param, str(tmp)), 2)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)], reference, start, tmp


def test_values_and_one_update_equal_the_torch_critic(runs):
    ranks, ref, start, tmp = runs
    mask = ref["mask"]
    assert ref["metrics"]["grad_norm"] > ENGINE_ARGS["grad_clip"]  # the grad clipping bites
    assert 0 < ref["metrics"]["critic/clip_fraction"] < 1  # so does the value clipping, on some tokens
    for out in ranks:
        for key in ("values", "values_after"):
            torch.testing.assert_close(out[key] * mask, ref[key] * mask, rtol=0, atol=1e-5, msg=key)
        for key in ("grad_norm", "critic/value_loss", "critic/clip_fraction"):
            assert out["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-6), key
        assert out["weights"].keys() == ref["weights"].keys() == start.keys()
        assert_grads_close(out["grads"], ref["grads"])
        for key, weight in ref["weights"].items():
            assert_first_step_close(out["weights"][key], weight, ref["grads"][key], grad_tolerance(ref["grads"]),
                                    ENGINE_ARGS["lr"], key)
            assert not torch.equal(weight, start[key]), key  # every weight moved, the head and the trunk
        assert out["round_trip"]
        # state_dict / load_state_dict, and the dist checkpoint of save_state / load_state, resume bit-exactly
        assert out["reloaded_equal"] == out["resumed_equal"] == [True, True]
        assert out["saved"] == {"dist_checkpoint": "critic.mcore"}
    parts = ranks[0]["parts"]
    assert "critic.mcore" in parts and sum(p.startswith("critic.mcore.") and p.endswith(".distcp") for p in parts) == 2
    for out in ranks:
        assert ("at_pp2" in out) == (out["layout"] == (2, 1))
        if "at_pp2" in out:
            saved, loaded = out["state"], out["at_pp2"]
            assert loaded["model"].keys() == saved["model"].keys()
            assert all(torch.equal(loaded["model"][k], w) for k, w in saved["model"].items())
            for key in ("exp_avg", "exp_avg_sq"):
                assert all(torch.equal(loaded["optimizer"][key][k], m) for k, m in saved["optimizer"][key].items())
            assert loaded["optimizer"]["step"] == saved["optimizer"]["step"] == 1.0

    from transformers import AutoModelForTokenClassification

    saved = AutoModelForTokenClassification.from_pretrained(tmp / "saved", dtype=torch.float32).state_dict()
    assert saved.keys() == ranks[0]["second"].keys()
    for key, weight in saved.items():
        assert torch.equal(weight, ranks[0]["second"][key]), key


def test_the_value_head_starts_at_zero_like_load_critic():
    from dockflow.engines.megatron.value import ValueHead

    head = ValueHead(8, bias=True)
    values, _ = head(torch.randn(3, 2, 8))
    assert values.shape == (3, 2, 1) and torch.equal(values, torch.zeros(3, 2, 1))
