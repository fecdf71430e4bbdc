"""The actor (policy) worker: a Ray actor that generates, computes old log-probs, updates and evaluates.

It holds the policy in a training engine and a generation engine (colocated: generation shares the
policy's tensors, so resharding is a no-op on one process). Every method reads its inputs from the
transfer dock and writes its outputs back; the driver passes only iteration numbers and prompt indices.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tensordict import TensorDict

from dockflow.algos import clipped_policy_loss
from dockflow.config import Config
from dockflow.data import apply_template, load_task
from dockflow.dock import TransferDock
from dockflow.engines import SamplingParams, create_engines
from dockflow.models import load_model_and_tokenizer
from dockflow.models.evaluation import greedy_accuracy
from dockflow.workers.columns import consumers
from dockflow.workers.consume import consume
from dockflow.workers.runtime import init_worker_process, rng_state, set_rng_state


def generation_seed(run_seed: int, iteration: int) -> int:
    """Sampling seed of one iteration: a resumed run draws the same responses as an uninterrupted one."""
    return (run_seed * 1_000_003 + iteration) % 2**62


class ActorWorker:
    """Policy states: generate -> (reshard) -> old log-probs -> update; plus greedy evaluation."""

    def __init__(self, cfg: Config, model_dir: str, dock: TransferDock):
        init_worker_process(cfg.ray.torch_threads, cfg.run.seed)
        self.cfg = cfg
        self.dock = dock
        model, self.tokenizer = load_model_and_tokenizer(model_dir, dtype=cfg.model.dtype)
        self.train_engine, self.gen_engine = create_engines(cfg, model, self.tokenizer)
        self.task = load_task(cfg.data, cfg.run.seed)
        self.update_columns = consumers(cfg)["actor_update"]
        self.policy_version = 0

    def ready(self) -> bool:
        return True

    def _prompts(self, examples) -> list[str]:
        return [apply_template(self.cfg.data.prompt_template, ex.prompt) for ex in examples]

    def generate(self, iteration: int, prompt_ids: list[int]) -> dict[str, float]:
        """Sample N responses for each prompt and stream them into the dock, group by group."""
        start = time.perf_counter()
        ro = self.cfg.rollout
        prompts = self._prompts([self.task.train[i] for i in prompt_ids])
        width = self.gen_engine.prompt_width(prompts)
        params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=ro.group_size)
        per_chunk = max(1, ro.batch_size // ro.group_size)
        seed = generation_seed(self.cfg.run.seed, iteration)
        prompt_tokens = response_tokens = 0
        for c in range(0, len(prompts), per_chunk):
            out = self.gen_engine.generate(prompts[c : c + per_chunk], params, seed + c, prompt_width=width)
            first = c * ro.group_size
            indices = list(range(first, first + out.batch_size[0]))
            pids = torch.tensor(prompt_ids[c : c + per_chunk]).repeat_interleave(ro.group_size)
            meta = {
                "prompt_id": pids,
                "response_length": out["response_length"],
                "policy_version": torch.full((len(indices),), self.policy_version),
            }
            self.dock.put(indices, out.select("input_ids", "attention_mask", "responses", "response_mask"), meta)
            prompt_tokens += int(out["prompt_length"].sum())
            response_tokens += int(out["response_length"].sum())
        n = len(prompts) * ro.group_size
        return {
            "timing/generate_s": time.perf_counter() - start,
            "rollout/prompt_length": prompt_tokens / n,
            "rollout/response_length": response_tokens / n,
            "rollout/tokens": float(prompt_tokens + response_tokens),
        }

    def compute_old_log_prob(self, iteration: int) -> dict[str, float]:
        """Log-probs of the behaviour policy (the weights that generated), for the ratio."""
        start = time.perf_counter()
        cols = ["input_ids", "attention_mask", "responses"]
        for batch in consume(self.dock, "actor_infer", cols, self.cfg.global_batch, self.cfg.train.infer_batch_size):
            logp = self.train_engine.log_probs(batch.data)
            self.dock.put(batch.indices, TensorDict({"old_log_prob": logp}, batch_size=[len(batch)]))
        return {"timing/old_log_prob_s": time.perf_counter() - start}

    def _loss(self, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        alg = self.cfg.algorithm
        out = clipped_policy_loss(
            logp,
            micro["old_log_prob"],
            micro["advantages"],
            micro["response_mask"],
            clip_eps=alg.clip_eps,
            ref_logp=micro.get("ref_log_prob", None),
            kl_coef=alg.kl_coef,
            kl_estimator=alg.kl_estimator,
            token_denom=tokens,
        )
        metrics = {
            "train/pg_loss": float(out.pg_loss),
            "train/kl": float(out.kl),
            "train/clip_fraction": float(out.clip_fraction),
            "train/approx_kl_old": float(out.approx_kl_old),
            "train/loss": float(out.loss.detach()) * tokens / max(float(micro["response_mask"].sum()), 1.0),
        }
        return out.loss, metrics

    def update(self, iteration: int) -> dict[str, float]:
        """Train on the iteration's samples: mini-batches as they become ready, then further epochs."""
        start = time.perf_counter()
        tc = self.cfg.train
        seen: list[TensorDict] = []
        totals: dict[str, float] = {}
        steps = 0

        def step(mb: TensorDict) -> None:
            nonlocal steps
            for k, v in self.train_engine.train_mini_batch(mb, self._loss, tc.micro_batch_size).items():
                totals[k] = totals.get(k, 0.0) + v
            steps += 1

        for batch in consume(self.dock, "actor_update", self.update_columns, self.cfg.global_batch, tc.mini_batch_size):
            seen.append(batch.data)
            step(batch.data)
        for _ in range(tc.epochs - 1):
            for mb in seen:
                step(mb)
        self.policy_version += 1
        out = {k: v / steps for k, v in totals.items()}
        out["timing/update_s"] = time.perf_counter() - start
        out["train/policy_version"] = float(self.policy_version)
        return out

    def reshard(self, iteration: int) -> dict[str, float]:
        """Hand the updated weights to the generation engine (colocated: the same tensors, nothing copied)."""
        start = time.perf_counter()
        self.gen_engine.load_weights(self.train_engine.named_weights())
        return {"timing/reshard_s": time.perf_counter() - start}

    def evaluate(self, split: str = "test", limit: int | None = None) -> dict[str, float]:
        """Greedy accuracy on a held-out split, scored by the verifier (the same code SFT validates with)."""
        start = time.perf_counter()
        examples = getattr(self.task, split)[: limit or None]
        acc = greedy_accuracy(
            self.train_engine.model,
            self.tokenizer,
            examples,
            self.cfg.eval.batch_size,
            self.cfg.rollout.max_new_tokens,
            self.cfg.data.prompt_template,
        )
        return {f"eval/{split}_accuracy": acc, "timing/eval_s": time.perf_counter() - start}

    def state(self) -> dict[str, Any]:
        """Everything a checkpoint needs from this worker."""
        return {"engine": self.train_engine.state_dict(), "rng": rng_state(), "policy_version": self.policy_version}

    def save(self, store, step: int) -> None:
        store.write_part(step, "actor", self.state())

    def load(self, store, step: int) -> None:
        state = store.read_part(step, "actor", weights_only=False)
        self.train_engine.load_state_dict(state["engine"])
        set_rng_state(state["rng"])
        self.policy_version = state["policy_version"]

    def save_hf(self, path: str) -> str:
        """The current policy as an HF model directory."""
        self.train_engine.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        return path
