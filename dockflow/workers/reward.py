"""The reward worker: scores responses with the run's reward functions (and reward models); its advantage state
(``workers/advantage.py``) then computes the advantages.

It holds no model, only the tokenizer (to decode) and the task's train rows (looked up by the prompt id that the
dock carries as metadata): their prompts, answers and other columns are what the reward functions get, in TRL's
convention (``dockflow.rewards.functions``; conversational rows: prompts and completions as message lists; tool runs:
each trajectory's prompt and multi-turn completion from its ``tool_record``, the environments as ``environments=`` and
each environment class's ``get_reward()`` as a reward source of weight 1, as TRL's GRPOTrainer passes them). The
built-ins run here, the user's functions in a child process,
under ``reward.timeout_s`` (``dockflow.rewards.runner``; ``reward.functions[].isolate``); reward models' scores
come from the dock (``rm_scores``, written by the reward-model worker). Light: it asks Ray for no CPU. The algorithm's recipe shapes the combined reward (DAPO:
overlong responses); ``AdvantageState`` gives advantages to the groups the run plan's sampling selects.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dockflow.agents import tool_spec
from dockflow.agents.environments import reward_environments
from dockflow.agents.records import TrajectoryRecord, unpack_record
from dockflow.algos.plan import RunPlan
from dockflow.background import run_in_background
from dockflow.config import Config
from dockflow.data import Example, columns_of, load_task
from dockflow.dock import DockBatch, DockRequest, TransferDock
from dockflow.engines.token_layout import decode_responses, response_ids
from dockflow.models import load_tokenizer
from dockflow.rewards.functions import combine, completion_text, function_path, trl_completions
from dockflow.rewards.runner import RewardBatch, RewardRunner, RunState
from dockflow.rewards.verifier import task_verifier
from dockflow.storage.objects import fetch_model
from dockflow.workers.advantage import AdvantageState, RoundAdvantages
from dockflow.workers.consume import WaitClock, consume, fill_column


def row_columns(examples: list[Example], answer_key: str = "answer", names: list[str] | None = None) -> dict[str, list]:
    """The keyword columns of a batch's rows, as TRL passes a dataset's columns: ``names`` (the dataset's,
    ``columns_of`` its train rows; default: these rows'), the reference answer under ``answer_key``, the others
    from the rows' fields (None in the rows that lack one)."""
    names = columns_of(examples, answer_key) if names is None else names
    return {k: [ex.answer if k == answer_key else ex.fields.get(k) for ex in examples] for k in names}


@dataclass
class Scoring:
    """One dock batch as the reward functions get it (``prompts``, ``completions``, ``completion_ids``, TRL's
    ``environments``), the texts the task's verifier scores, and each reward environment's ``get_reward()``."""

    prompts: list[Any]
    completions: list[Any]
    completion_ids: list[list[int]]
    texts: list[str]
    environments: list[Any] | None = None
    environment_rewards: list[list[float]] = field(default_factory=list)


def tool_view(records: list[TrajectoryRecord], responses: torch.Tensor, lengths: list[int],
              env_rewards: list[str], environments: bool) -> Scoring:
    """A tool run's batch as TRL passes it: each prompt as the model saw it, the multi-turn completion (assistant
    turns with their tool calls, tool messages), the completion's ids (every token after the prompt, tool
    results included), with ``environments`` the environment instances; the verifier scores the final answer;
    each class of ``env_rewards`` is a reward source: its rollouts' ``get_reward()``, NaN for the others."""
    whole = [row[:n] for row, n in zip(responses.tolist(), lengths, strict=True)]
    completions = [r.completion for r in records]
    envs = [[r.reward if r.environment == name and r.reward is not None else math.nan for r in records]
            for name in env_rewards]
    return Scoring([r.prompt for r in records], completions, whole, [completion_text(c) for c in completions],
                   [r.state for r in records] if environments else None, envs)


def _stats(values: list[float]) -> tuple[float, float]:
    """(mean, std) over the values that are not NaN (NaN, NaN when none is)."""
    t = torch.tensor([v for v in values if not math.isnan(v)], dtype=torch.float64)
    if not len(t):
        return math.nan, math.nan
    return float(t.mean()), float(t.std()) if len(t) > 1 else 0.0


class RewardWorker:
    """Consumer states ``reward`` (writes ``rewards``) and ``advantage`` (writes ``advantages``, ``returns``)."""

    def __init__(self, cfg: Config, plan: RunPlan, model_dir: str, dock: TransferDock):
        self.plan = plan  # the run plan, built once by the driver
        run_in_background()  # a light actor (num_cpus=0): its wake-ups wait for a free core (dockflow/background.py)
        self.cfg = cfg
        self.dock = dock
        self.tokenizer = load_tokenizer(fetch_model(model_dir, cfg.checkpoint))
        self.examples = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint).train
        self.column_names = columns_of(self.examples, cfg.data.answer_key)  # every batch passes every column
        self.verifier = task_verifier(cfg.data)  # reward/correct_fraction counts what held-out accuracy counts
        rc = cfg.reward
        self.runner = RewardRunner([(f.label, function_path(f)) for f in rc.functions], rc.timeout_s,
                                   in_process={f.label for f in rc.functions if f.in_worker})
        self.runner.start()  # from the actor's own thread, whose end the child process (if any) follows
        # TRL's extra reward sources: each environment class with get_reward(), weight 1, named after the class
        self.tools = cfg.tools.enabled
        self.env_rewards = reward_environments(tool_spec(cfg.tools, self.tokenizer).factories) if self.tools else []
        self.labels = [f.label for f in rc.functions] + [m.label for m in rc.models] + self.env_rewards
        self.weights = [f.weight for f in rc.functions] + [m.weight for m in rc.models] + [1.0] * len(self.env_rewards)
        self.columns = plan.role("reward").reads  # its states' dock columns: reward, advantage
        self.recipe = plan.recipe  # the algorithm's reward shaping
        self.advantage = AdvantageState(cfg, plan, dock)

    def ready(self) -> bool:
        return True

    def _view(self, batch, rows: list[Example]) -> Scoring:
        """What the reward functions and the verifier see of one dock batch (TRL's arguments)."""
        data = batch.data
        if not self.tools:
            ids = response_ids(data["responses"], data["response_mask"])
            texts = decode_responses(self.tokenizer, data["responses"], data["response_mask"], ids)
            prompts = [ex.prompt for ex in rows]  # a conversational row's messages, as TRL passes them
            return Scoring(prompts, trl_completions(prompts, texts), ids, texts)
        return tool_view([unpack_record(row) for row in data["tool_record"]], data["responses"],
                         batch.meta["response_length"].tolist(), self.env_rewards, self.cfg.tools.has_environment)

    def _score(
        self, batch, iteration: int, view: Scoring, rows: list[Example]
    ) -> tuple[list[list[float]], dict[str, list[float]], float, float]:
        """Per-source values (functions, models, then environments) of one dock batch, what the functions logged,
        the scoring call's seconds (with any process hop) and the functions' own (where they ran)."""
        lo = self.plan.dock_window(iteration)[0]
        request = RewardBatch(
            prompts=view.prompts, completions=view.completions, completion_ids=view.completion_ids,
            columns=row_columns(rows, self.cfg.data.answer_key, self.column_names),
            state=RunState(global_step=iteration, max_steps=self.cfg.train.iterations),
            sample_ids=[i - lo for i in batch.indices], environments=view.environments,
            answer_key=self.cfg.data.answer_key,
        )
        start = time.perf_counter()
        scored = self.runner.score(request)
        call_s = time.perf_counter() - start
        columns = [r.values for r in scored.values()]
        if self.cfg.reward.models:
            columns += batch.data["rm_scores"].T.tolist()
        columns += view.environment_rewards
        logged: dict[str, list[float]] = {}
        for result in scored.values():
            for name, value in result.metrics.items():
                logged.setdefault(name, []).append(value)
        return columns, logged, call_s, sum(r.seconds for r in scored.values())

    def compute_rewards(self, iteration: int) -> dict[str, float]:
        """Score one generation round (G x N samples) into ``rewards``: the weighted sum of every reward
        function and model that applies to a sample (``docs/rewards.md``), shaped by the algorithm."""
        combined: list[float] = []
        per_source: list[list[float]] = [[] for _ in self.labels]
        logged: dict[str, list[float]] = {}
        counts = {"correct": 0, "unscorable": 0, "functions_s": 0.0, "own_s": 0.0}

        def rewards_of(batch: DockBatch) -> torch.Tensor:
            rows = [self.examples[p] for p in batch.meta["prompt_id"].tolist()]
            view = self._view(batch, rows)
            values, batch_logged, call_s, own = self._score(batch, iteration, view, rows)
            counts["functions_s"] += call_s
            counts["own_s"] += own
            for acc, col in zip(per_source, values, strict=True):
                acc.extend(col)
            for name, v in batch_logged.items():
                logged.setdefault(name, []).extend(v)
            counts["unscorable"] += sum(all(math.isnan(col[i]) for col in values) for i in range(len(view.texts)))
            counts["correct"] += sum(self.verifier(t, ex) > 0 for t, ex in zip(view.texts, rows, strict=True))
            score = torch.tensor(combine(values, self.weights), dtype=torch.float32)
            score = self.recipe.shape_rewards(self.cfg, score, batch.meta["response_length"])  # DAPO: overlong shaping
            combined.extend(score.tolist())
            return score

        request = DockRequest("reward", self.cfg.train.infer_batch_size, self.columns["reward"],
                              window=self.plan.dock_window(iteration))
        waited = WaitClock()
        seconds = fill_column(self.dock, consume(self.dock, request, self.cfg.global_batch, clock=waited), "rewards",
                              rewards_of)
        mean, std = _stats(combined)
        metrics = {"reward/mean": mean, "reward/std": std, "reward/correct_fraction": counts["correct"] / len(combined),
                   "reward/unscorable_fraction": counts["unscorable"] / len(combined), "timing/reward_s": seconds,
                   "timing/reward_wait_s": waited.seconds,  # of reward_s: waiting on the dock for responses
                   "timing/reward_functions_s": counts["functions_s"],  # of reward_s: the calls, with any process hop
                   "timing/reward_functions_own_s": counts["own_s"]}  # of those: the functions' own time
        for label, values in zip(self.labels, per_source, strict=True):
            metrics[f"rewards/{label}/mean"], metrics[f"rewards/{label}/std"] = _stats(values)
        metrics.update({name: sum(v) / len(v) for name, v in logged.items()})
        return {k: v for k, v in metrics.items() if not math.isnan(v)}  # a function that never applied logs nothing

    def compute_advantages(self, iteration: int, round_index: int = 0, last_round: bool = True) -> RoundAdvantages:
        """Advantages of one generation round (``AdvantageState.compute``)."""
        return self.advantage.compute(iteration, round_index, last_round)
