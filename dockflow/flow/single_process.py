"""One run of a group-relative algorithm in one process, top to bottom: the map to read before the distributed run.

    python -m dockflow.flow.single_process configs/grpo_arith.yaml train.iterations=2 --model runs/sft/model

No Ray, no transfer dock, no stage loops: the building blocks that the workers call, in phase order, on one
batch held in memory. Each step names the worker and stage that does it in a real run (``flow/iteration.py``
orders them; the dock streams each one behind the one before). A one-worker run at the same seed (colocated,
one actor rank, old log-probs recomputed, no critic or reference) ends with the same weights bit for bit
(``tests/integration/test_train_loop.py``), so this loop is what a run computes, without how it is spread out.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from dockflow.algos.base import Algorithm
from dockflow.config import Config, load_config
from dockflow.data import PromptFormat, columns_of, load_task
from dockflow.engines import EngineInputs, create_engines, decode_responses, response_ids
from dockflow.models import load_model_and_tokenizer
from dockflow.rewards.functions import combine, function_path, trl_completions
from dockflow.rewards.runner import RewardBatch, RewardRunner, RunState
from dockflow.rollout.plain import generate_into_dock
from dockflow.rollout.prompts import PromptTable, iteration_sampler
from dockflow.storage.manifest import CheckpointError
from dockflow.storage.objects import fetch_model
from dockflow.workers.advantage import filtration_seed
from dockflow.workers.resources import build_plan
from dockflow.workers.reward import row_columns
from dockflow.workers.runtime import init_worker_process
from dockflow.workers.update_loop import length_sorted, train_epochs

ROLLOUT = ("input_ids", "attention_mask", "responses", "response_mask")


@dataclass
class Batch:
    """One iteration's samples in memory, by index (what the dock's window holds in a real run)."""

    rows: dict[int, TensorDict] = field(default_factory=dict)
    meta: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)

    def put(self, indices: list[int], data: TensorDict, meta: dict[str, torch.Tensor] | None = None) -> None:
        """The dock's ``put``, in memory: generation writes here through the same function as in a run."""
        for k, i in enumerate(indices):
            self.rows[i] = data[k]
            for name, values in (meta or {}).items():
                self.meta.setdefault(name, {})[i] = values[k]

    def all(self) -> tuple[TensorDict, dict[str, torch.Tensor]]:
        order = sorted(self.rows)
        return (torch.stack([self.rows[i] for i in order]),
                {name: torch.stack([col[i] for i in order]) for name, col in self.meta.items()})


def check_single_process(cfg: Config) -> None:
    """What this loop covers: one colocated actor on the HF engine, a group-relative algorithm without critic or
    reference that trains on every sample it generates, old log-probs recomputed, single-turn rollouts."""
    from dockflow.algos import recipe_of

    recipe = recipe_of(cfg.algorithm.name)
    refused = {
        "placement.mode is not colocated": cfg.placement.mode != "colocated",
        "train.actor_ranks > 1": cfg.train.actor_ranks > 1,
        "engine.backend is not hf": cfg.engine.backend != "hf",
        "tools are configured": cfg.tools.enabled,
        f"algorithm.name={cfg.algorithm.name} is not group-relative without a critic or reference": (
            recipe.offline or getattr(recipe, "critic", False) or getattr(cfg.algorithm, "kl_coef", 0.0) > 0
            or recipe.samples_in_rounds(cfg) or recipe.train_batch(cfg) != cfg.global_batch),
        "train.old_log_prob is not recompute": cfg.train.old_log_prob != "recompute",
    }
    for why, bad in refused.items():
        if bad:
            raise ValueError(f"the single-process loop does not run this config: {why}")


def run_single_process(cfg: Config, model_dir: str) -> dict[str, list]:
    """``cfg.train.iterations`` iterations from the model at ``model_dir``; returns each iteration's mean reward and
    the final policy's weights (``{"reward_per_iteration": [...], "weights": {name: tensor}}``)."""
    check_single_process(cfg)
    plan = build_plan(cfg)  # this loop is its own driver
    recipe, tc = plan.recipe, cfg.train
    # ---- set-up: what the actor and reward workers build when they start ----
    init_worker_process(cfg.ray, cfg.run.seed)  # torch threads and seeds, as in a model worker
    model, tokenizer = load_model_and_tokenizer(fetch_model(model_dir, cfg.checkpoint), dtype=cfg.model.dtype)
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed, cfg.model.lora)
    train_engine, gen_engine = create_engines(inputs, model, tokenizer, cpus=cfg.ray.actor_cpus)
    task = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint)
    table = PromptTable(PromptFormat.of(cfg.data).render_all([ex.prompt for ex in task.train], tokenizer), gen_engine)
    sampler = iteration_sampler(cfg, plan)
    functions = cfg.reward.functions
    runner = RewardRunner([(f.label, function_path(f)) for f in functions], cfg.reward.timeout_s,
                          in_process={f.label for f in functions})
    runner.start()
    rewards_seen: list[float] = []
    try:
        for i in range(tc.iterations):
            # ---- 1. generate (actor): N responses for each of the iteration's G prompts ----
            batch = Batch()
            generate_into_dock(cfg, gen_engine, batch, table, iteration=i, prompt_ids=sampler.indices(i),
                               first_index=0, policy_version=i, window_start=0)
            data, meta = batch.all()
            # ---- 2. infer: rewards (reward worker), advantages (its advantage state), old log-probs (actor) ----
            rows = [task.train[p] for p in meta["prompt_id"].tolist()]
            data["rewards"] = rewards(cfg, recipe, runner, tokenizer, (data, rows), i, meta["response_length"])
            rewards_seen.append(float(data["rewards"].mean()))
            data["advantages"] = advantages(cfg, recipe, data, i)
            data["old_log_prob"] = torch.cat([train_engine.infer(data[lo:lo + tc.infer_batch_size])
                                              for lo in range(0, len(data), tc.infer_batch_size)])
            # ---- 3. update (actor): one optimizer step per mini-batch, in the window's order ----
            minis = [data[lo:lo + tc.mini_batch_size] for lo in range(0, recipe.train_batch(cfg), tc.mini_batch_size)]
            if tc.seqlen_balance:
                minis = [length_sorted(mb, tc.micro_batch_size if tc.max_tokens_per_micro_batch is None else 1)
                         for mb in minis]
            train_epochs(train_engine, minis, lambda logp, mb, tokens: recipe.policy_loss(cfg, logp, mb, tokens),
                         tc.epochs, tc.micro_batch_size)
            # ---- 4. reshard (actor): generation takes the new weights ----
            gen_engine.load_weights(train_engine.generation_weights())
    finally:
        runner.close()
    weights = {k: v.detach().clone() for k, v in train_engine.policy_module().state_dict().items()}
    return {"reward_per_iteration": rewards_seen, "weights": weights}


def rewards(cfg: Config, recipe: Algorithm, runner: RewardRunner, tokenizer, samples: tuple[TensorDict, list],
            iteration: int, response_length: torch.Tensor) -> torch.Tensor:
    """The reward worker's ``reward`` state: every reward function on the decoded responses (TRL's arguments) of
    ``samples`` (the batch and its dataset rows), weighted and summed, then the algorithm's shaping."""
    data, rows = samples
    ids = response_ids(data["responses"], data["response_mask"])
    texts = decode_responses(tokenizer, data["responses"], data["response_mask"], ids)
    prompts = [ex.prompt for ex in rows]
    scored = runner.score(RewardBatch(
        prompts=prompts, completions=trl_completions(prompts, texts), completion_ids=ids,
        columns=row_columns(rows, cfg.data.answer_key, columns_of(rows, cfg.data.answer_key)),
        state=RunState(global_step=iteration, max_steps=cfg.train.iterations), sample_ids=list(range(len(rows))),
        environments=None, answer_key=cfg.data.answer_key))
    combined = combine([r.values for r in scored.values()], [f.weight for f in cfg.reward.functions])
    score = torch.tensor(combined, dtype=torch.float32)
    return recipe.shape_rewards(cfg, score, response_length)


def advantages(cfg: Config, recipe: Algorithm, data: TensorDict, iteration: int) -> torch.Tensor:
    """The advantage state: the algorithm's estimator over whole groups, a batch of them at a time."""
    generator = torch.Generator().manual_seed(filtration_seed(cfg.run.seed, iteration))
    size, out = recipe.advantage_batch_size(cfg), torch.zeros_like(data["response_mask"], dtype=torch.float32)
    for lo in range(0, len(data), size):
        kept, cols = recipe.advantages(cfg, data[lo:lo + size], generator)
        out[lo + kept] = cols["advantages"]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config")
    p.add_argument("--model", required=True, help="the initial policy: a local HF directory or s3:// URI")
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args(argv)
    try:
        result = run_single_process(load_config(args.config, args.overrides), args.model)
    except (ValueError, OSError, CheckpointError) as exc:  # a bad config, a config this loop does not run, no model
        print(f"error: {exc}", file=sys.stderr)  # one line, exit 2 as the dockflow CLI does
        raise SystemExit(2) from None
    for i, r in enumerate(result["reward_per_iteration"], 1):
        print(f"iteration {i}: reward/mean {r:.4f}" if not math.isnan(r) else f"iteration {i}: no reward")


if __name__ == "__main__":
    main()
