"""The reward worker: scores responses with the run's reward functions (and reward models); its advantage state
(``workers/advantage.py``) then computes the advantages.

It holds no model, only the tokenizer (to decode) and the task's train rows (looked up by the prompt id that the
dock carries as metadata): their prompts, answers and other columns are what the reward functions get, in TRL's
convention (``dockflow.rewards.functions``; conversational rows: prompts and completions as message lists). The built-ins run here, the user's functions in a child process,
under ``reward.timeout_s`` (``dockflow.rewards.runner``; ``reward.functions[].isolate``); reward models' scores
come from the dock (``rm_scores``, written by the reward-model worker). Light: it asks Ray for no CPU. The algorithm's recipe shapes the combined reward (DAPO:
overlong responses); ``AdvantageState`` gives advantages to the groups the run plan's sampling selects.
"""

from __future__ import annotations

import math
import time

import torch
from tensordict import TensorDict

from dockflow.background import run_in_background
from dockflow.config import Config
from dockflow.data import Example, load_task
from dockflow.dock import DockRequest, TransferDock
from dockflow.engines import decode_responses, response_ids
from dockflow.models import load_tokenizer
from dockflow.rewards.functions import combine, function_path, trl_completions
from dockflow.rewards.runner import RewardBatch, RewardRunner, RunState
from dockflow.rewards.verifier import task_verifier
from dockflow.storage.objects import fetch_model
from dockflow.workers.advantage import AdvantageState, RoundAdvantages
from dockflow.workers.consume import WaitClock, consume


def row_columns(examples: list[Example], answer_key: str = "answer") -> dict[str, list]:
    """The keyword columns of a batch's rows, as TRL passes a dataset's columns: the answer, then every other
    column (None in the rows that lack it)."""
    names = dict.fromkeys(k for ex in examples for k in ex.fields)
    cols = {answer_key: [ex.answer for ex in examples]}
    cols.update({k: [ex.fields.get(k) for ex in examples] for k in names if k != answer_key})
    return cols


def _stats(values: list[float]) -> tuple[float, float]:
    """(mean, std) over the values that are not NaN (NaN, NaN when none is)."""
    t = torch.tensor([v for v in values if not math.isnan(v)], dtype=torch.float64)
    if not len(t):
        return math.nan, math.nan
    return float(t.mean()), float(t.std()) if len(t) > 1 else 0.0


class RewardWorker:
    """Consumer states ``reward`` (writes ``rewards``) and ``advantage`` (writes ``advantages``, ``returns``)."""

    def __init__(self, cfg: Config, model_dir: str, dock: TransferDock):
        run_in_background()  # a light actor (num_cpus=0): its wake-ups wait for a free core (dockflow/background.py)
        self.cfg = cfg
        self.dock = dock
        self.tokenizer = load_tokenizer(fetch_model(model_dir, cfg.checkpoint))
        self.examples = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint).train
        self.verifier = task_verifier(cfg.data)  # reward/correct_fraction counts what held-out accuracy counts
        rc = cfg.reward
        self.runner = RewardRunner([(f.label, function_path(f)) for f in rc.functions], rc.timeout_s,
                                   in_process={f.label for f in rc.functions if f.in_worker})
        self.runner.start()  # from the actor's own thread, whose end the child process (if any) follows
        self.labels = [f.label for f in rc.functions] + [m.label for m in rc.models]
        self.weights = [f.weight for f in rc.functions] + [m.weight for m in rc.models]
        self.columns = cfg.plan.role("reward").reads  # its states' dock columns: reward, advantage
        self.recipe = cfg.algorithm.recipe  # the algorithm's reward shaping
        self.advantage = AdvantageState(cfg, dock)

    def ready(self) -> bool:
        return True

    def _score(
        self, batch, iteration: int, texts: list[str], ids: list[list[int]]
    ) -> tuple[list[list[float]], dict[str, list[float]], float, float]:
        """Per-source values (functions, then models) of one dock batch, what the functions logged, the scoring
        call's seconds (with any process hop) and the functions' own (where they ran)."""
        rows = [self.examples[p] for p in batch.meta["prompt_id"].tolist()]
        lo = self.cfg.dock_window(iteration)[0]
        prompts = [ex.prompt for ex in rows]  # a conversational row's messages, as TRL passes them
        request = RewardBatch(
            prompts=prompts, completions=trl_completions(prompts, texts), completion_ids=ids,
            columns=row_columns(rows, self.cfg.data.answer_key),
            state=RunState(global_step=iteration, max_steps=self.cfg.train.iterations),
            sample_ids=[i - lo for i in batch.indices],
        )
        start = time.perf_counter()
        scored = self.runner.score(request)
        call_s = time.perf_counter() - start
        columns = [r.values for r in scored.values()]
        if self.cfg.reward.models:
            columns += batch.data["rm_scores"].T.tolist()
        logged: dict[str, list[float]] = {}
        for result in scored.values():
            for name, value in result.metrics.items():
                logged.setdefault(name, []).append(value)
        return columns, logged, call_s, sum(r.seconds for r in scored.values())

    def compute_rewards(self, iteration: int) -> dict[str, float]:
        """Score one generation round (G x N samples) into ``rewards``: the weighted sum of every reward
        function and model that applies to a sample (``docs/rewards.md``), shaped by the algorithm."""
        start = time.perf_counter()
        combined: list[float] = []
        per_source: list[list[float]] = [[] for _ in self.labels]
        logged: dict[str, list[float]] = {}
        correct = unscorable = 0
        bs = self.cfg.train.infer_batch_size
        columns = self.columns["reward"]
        request = DockRequest("reward", bs, columns, window=self.cfg.dock_window(iteration))
        waited, functions_s, own_s = WaitClock(), 0.0, 0.0
        for batch in consume(self.dock, request, self.cfg.global_batch, clock=waited):
            ids = response_ids(batch.data["responses"], batch.data["response_mask"])
            texts = decode_responses(self.tokenizer, batch.data["responses"], batch.data["response_mask"], ids)
            values, batch_logged, call_s, own = self._score(batch, iteration, texts, ids)
            functions_s, own_s = functions_s + call_s, own_s + own
            for acc, col in zip(per_source, values, strict=True):
                acc.extend(col)
            for name, v in batch_logged.items():
                logged.setdefault(name, []).extend(v)
            unscorable += sum(all(math.isnan(col[i]) for col in values) for i in range(len(texts)))
            correct += sum(self.verifier(t, self.examples[p]) > 0
                           for t, p in zip(texts, batch.meta["prompt_id"].tolist(), strict=True))
            score = torch.tensor(combine(values, self.weights), dtype=torch.float32)
            score = self.recipe.shape_rewards(self.cfg, score, batch.meta["response_length"])  # DAPO: overlong shaping
            self.dock.put(batch.indices, TensorDict({"rewards": score}, batch_size=[len(batch)]))
            combined.extend(score.tolist())
        mean, std = _stats(combined)
        metrics = {"reward/mean": mean, "reward/std": std, "reward/correct_fraction": correct / len(combined),
                   "reward/unscorable_fraction": unscorable / len(combined), "timing/reward_s": time.perf_counter() - start,
                   "timing/reward_wait_s": waited.seconds,  # of reward_s: waiting on the dock for responses
                   "timing/reward_functions_s": functions_s,  # of reward_s: the calls, with any process hop
                   "timing/reward_functions_own_s": own_s}  # of those: the functions' own time
        for label, values in zip(self.labels, per_source, strict=True):
            metrics[f"rewards/{label}/mean"], metrics[f"rewards/{label}/std"] = _stats(values)
        metrics.update({name: sum(v) / len(v) for name, v in logged.items()})
        return {k: v for k, v in metrics.items() if not math.isnan(v)}  # a function that never applied logs nothing

    def compute_advantages(self, iteration: int, round_index: int = 0, last_round: bool = True) -> RoundAdvantages:
        """Advantages of one generation round (``AdvantageState.compute``)."""
        return self.advantage.compute(iteration, round_index, last_round)
