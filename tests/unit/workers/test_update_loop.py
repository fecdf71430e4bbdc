"""Length-sorted micro-batches: same update as index order, less padding computed."""

import torch
from fixtures.tiny_models import tiny_qwen2
from tensordict import TensorDict

from dockflow.engines import TorchTrainingEngine
from dockflow.workers.update_loop import length_sorted

P, R = 3, 6


def tiny_model():
    return tiny_qwen2(vocab_size=30)


def mini_batch() -> TensorDict:
    """8 rows whose response lengths alternate long and short; prompts left-padded to 3 tokens."""
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([6, 1, 5, 1, 6, 2, 5, 2])
    prompt_lengths = torch.tensor([3, 2, 3, 1, 2, 3, 1, 2])
    response_mask = (torch.arange(R) < lengths[:, None]).long()
    prompt_mask = (torch.arange(P).flip(0) < prompt_lengths[:, None]).long()
    responses = torch.randint(1, 30, (8, R), generator=gen) * response_mask
    prompts = torch.randint(1, 30, (8, P), generator=gen) * prompt_mask
    return TensorDict({
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": torch.cat([prompt_mask, response_mask], 1),
        "responses": responses,
        "response_mask": response_mask,
        "row": torch.arange(8),
    }, batch_size=[8])


def loss_fn(logp, micro, tokens):
    mask = micro["response_mask"]
    return -(logp * mask).sum() / tokens, {}


def test_rows_sorted_by_response_then_total_length_stay_whole():
    batch = mini_batch()
    out = length_sorted(batch, micro_batch_size=2)
    assert out["response_mask"].sum(-1).tolist() == [1, 1, 2, 2, 5, 5, 6, 6]
    assert out["row"].tolist() == [3, 1, 7, 5, 6, 2, 4, 0]  # ties: the shorter prompt first
    for column in ("input_ids", "attention_mask", "responses"):
        assert torch.equal(out[column], batch[column][out["row"]])
    assert length_sorted(batch, micro_batch_size=8) is batch  # one micro-batch: nothing to gain


class PaddedEngine(TorchTrainingEngine):
    """Never packs: every micro-batch padded to its longest row (what sorting by length is for)."""

    def _agree(self, pack: bool) -> bool:
        return False


def test_sorted_micro_batches_give_the_same_step_with_less_padding():
    results = []
    for batch in (mini_batch(), length_sorted(mini_batch(), micro_batch_size=2)):
        engine = PaddedEngine(tiny_model(), lr=1e-2)
        metrics = engine.train_mini_batch(batch, loss_fn, micro_batch_size=2)
        results.append((metrics, dict(engine.model.named_parameters())))
    (plain, plain_weights), (sorted_, sorted_weights) = results
    assert abs(plain["grad_norm"] - sorted_["grad_norm"]) < 1e-5
    for name, weight in plain_weights.items():
        torch.testing.assert_close(sorted_weights[name], weight, rtol=0, atol=1e-4, msg=name)
    # index order: each pair of rows holds a long and a short response, cut to 9, 8, 9 and 7 columns (66
    # positions); sorted, the pairs are cut to 3, 5, 8 and 9 columns (50 positions); 45 tokens are real
    assert plain["train/padding_fraction"] == 1 - 45 / 66
    assert sorted_["train/padding_fraction"] == 1 - 45 / 50
    assert int(mini_batch()["attention_mask"].sum()) == 45
