"""TRL's ``GRPOTrainer`` (PyPI ``trl``, CPU, transformers generation, no vLLM) matched to a DockFlow config.

The other half of ``benchmarks/vs_trl.py``. Given a DockFlow ``Config`` and the model directory DockFlow
starts from, it trains the same model on the same prompts, iteration by iteration, with the same
hyper-parameters (``trl_arguments``), the same verifier reward (``dockflow.rewards.verify``) and the same
held-out evaluation (``dockflow.eval.evaluate_policy``), and measures every iteration the way DockFlow's
sync loop does: G x N samples, mean prompt and response tokens of what was generated, end-to-end seconds.

    run = run_trl(cfg, model_dir, work_dir="runs/bench_vs_trl/trl_tiny")
    run.iterations[0].seconds, run.accuracy_before, run.accuracy_after

One TRL optimizer step is one DockFlow iteration when ``train.mini_batch_size`` equals G x N (the benchmark's
setups); ``trl_arguments`` also maps smaller mini-batches (TRL's ``steps_per_generation``) and epochs
(``num_iterations``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dockflow.config import Config
from dockflow.data import PromptFormat, load_task
from dockflow.eval import EvalInputs, evaluate_policy
from dockflow.models import load_model_and_tokenizer
from dockflow.rewards import verify
from dockflow.rollout.prompts import iteration_sampler
from dockflow.workers.resources import build_plan


@dataclass
class IterationStats:
    """One RL iteration as Eq. (5) needs it, plus where its time went (seconds per phase)."""

    samples: int
    prompt_length: float
    response_length: float
    seconds: float
    reward_mean: float
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class TRLRun:
    """What a TRL run measured: per-iteration stats, held-out accuracy before/after, wall seconds."""

    iterations: list[IterationStats]
    accuracy_before: float
    accuracy_after: float
    wall_s: float
    eval_s: float


def trl_arguments(cfg: Config, output_dir: str) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments that reproduce DockFlow's GRPO settings of ``cfg`` (see docs/vs_trl.md).

    Batch shape: DockFlow generates G x N samples per iteration, takes an optimizer step per
    ``mini_batch_size`` samples (accumulating ``micro_batch_size`` at a time) for ``epochs`` passes. TRL:
    ``generation_batch_size`` = G x N, ``per_device_train_batch_size`` = micro, ``gradient_accumulation_steps``
    = mini / micro, ``num_iterations`` = epochs; ``max_steps`` counts optimizer steps.
    """
    ro, tc, alg = cfg.rollout, cfg.train, cfg.algorithm
    batch = cfg.global_batch
    if alg.name != "grpo":
        raise ValueError(f"algorithm.name={alg.name!r}: the TRL comparison is GRPO only")
    if batch % tc.mini_batch_size or tc.mini_batch_size % tc.micro_batch_size:
        raise ValueError(
            f"G x N = {batch}, train.mini_batch_size={tc.mini_batch_size}, train.micro_batch_size="
            f"{tc.micro_batch_size}: each must divide the one before for TRL's batch layout"
        )
    steps_per_iteration = tc.epochs * batch // tc.mini_batch_size
    return {
        "output_dir": output_dir,
        # batch layout
        "per_device_train_batch_size": tc.micro_batch_size,
        "gradient_accumulation_steps": tc.mini_batch_size // tc.micro_batch_size,
        "generation_batch_size": batch,
        "num_generations": ro.group_size,
        "num_iterations": tc.epochs,
        "max_steps": tc.iterations * steps_per_iteration,
        "shuffle_dataset": False,  # the dataset is already in DockFlow's per-iteration prompt order
        # generation
        "max_completion_length": ro.max_new_tokens,
        "temperature": ro.temperature,
        "top_p": ro.top_p,
        "top_k": 0,  # disabled, as in DockFlow
        # loss: token-level mean over the optimizer step's tokens (DockFlow's token_denom) = TRL's "dapo"
        "loss_type": "dapo",
        "epsilon": alg.clip_eps,
        "beta": alg.kl_coef,
        "scale_rewards": "group" if alg.norm_adv_by_std else "none",
        "importance_sampling_level": "token",
        "mask_truncated_completions": False,
        # optimizer: torch AdamW with DockFlow's settings, constant learning rate
        "optim": "adamw_torch",
        "learning_rate": tc.lr,
        "weight_decay": tc.weight_decay,
        "max_grad_norm": tc.grad_clip,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        # numerics and memory as DockFlow: float32, no activation checkpointing
        "bf16": cfg.model.dtype == "bfloat16",
        "fp16": False,
        "gradient_checkpointing": False,
        "use_cpu": True,
        "seed": cfg.run.seed,
        # no side work in the timed loop beyond DockFlow's (it logs scalars per iteration)
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        "remove_unused_columns": False,
    }


def prompt_rows(cfg: Config, tokenizer: Any) -> list[dict[str, Any]]:
    """The train prompts of every iteration in DockFlow's order (``PromptSampler``), templated as DockFlow does.

    ``prompt_length`` is the prompt's token count as both systems encode it (with BOS), precomputed so that
    the timed loop does no extra tokenization.
    """
    task = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint)
    sampler = iteration_sampler(cfg, build_plan(cfg))
    rows = []
    for it in range(cfg.train.iterations):
        for i in sampler.indices(it):
            prompt = PromptFormat.of(cfg.data).render(task.train[i].prompt, tokenizer)
            rows.append({"prompt": prompt, "answer": task.train[i].answer, "prompt_length": len(tokenizer(prompt)["input_ids"])})
    return rows


class _Meter:
    """Per-iteration counters the reward function and the trainer hooks fill in; an iteration is the
    ``steps_per_iteration`` optimizer steps that follow one generation."""

    def __init__(self, steps_per_iteration: int, on_close: Callable[[], None] | None = None) -> None:
        self.steps_per_iteration = steps_per_iteration
        self.on_close = on_close
        self.iterations: list[IterationStats] = []
        self.reset()

    def reset(self) -> None:
        self.start = time.perf_counter()
        self.lengths: tuple[list[int], list[int]] = ([], [])
        self.rewards: list[float] = []
        self.phases: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def close(self) -> None:
        prompts, responses = self.lengths
        n = max(len(responses), 1)
        seconds = time.perf_counter() - self.start
        phases = dict(self.phases)
        # training_step = the generation step's _prepare_inputs (generate and score) + forward/backward
        train_step = phases.pop("train_step", 0.0) - phases.get("generate_and_score", 0.0)
        phases["update"] = train_step + phases.pop("optimizer", 0.0)
        phases["score"] = phases.pop("generate_and_score", 0.0) - phases.get("generate", 0.0)
        self.iterations.append(
            IterationStats(len(responses), sum(prompts) / n, sum(responses) / n, seconds, sum(self.rewards) / n, phases)
        )
        if self.on_close:
            self.on_close()


def verifier_reward(meter: _Meter) -> Callable[..., list[float]]:
    """DockFlow's reward (the math verifier on the decoded response) as a TRL reward function; it also records
    the iteration's actual prompt and response lengths (response tokens up to and including EOS, like DockFlow)."""

    def verify_answer(prompts, completions, completion_ids, answer, prompt_length, **_: Any) -> list[float]:
        meter.lengths[0].extend(int(p) for p in prompt_length)
        meter.lengths[1].extend(len(ids) for ids in completion_ids)
        scores = [verify(c, a) for c, a in zip(completions, answer, strict=True)]
        meter.rewards.extend(scores)
        return scores

    return verify_answer


def _timed_trainer(meter: _Meter):
    """A ``GRPOTrainer`` whose phases (generation, scoring, forward/backward, optimizer step) are timed."""
    return _timed_trainer_class(meter), _iteration_callback(meter)


def _timed_trainer_class(meter: _Meter):
    """``GRPOTrainer`` with its generation, scoring and train-step phases timed into ``meter``."""
    from trl import GRPOTrainer

    def timed(phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                meter.add(phase, time.perf_counter() - t0)

        return run

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            return timed("generate", super()._generate_single_turn)(*args, **kwargs)

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            return timed("reward", super()._calculate_rewards)(*args, **kwargs)

        def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
            return timed("generate_and_score", super()._generate_and_score_completions)(*args, **kwargs)

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            return timed("train_step", super().training_step)(*args, **kwargs)

    return TimedGRPOTrainer


def _iteration_callback(meter: _Meter):
    """A callback that times the optimizer step and opens/closes the meter's iterations."""
    from transformers import TrainerCallback

    class IterationCallback(TrainerCallback):
        """Opens an iteration before its first optimizer step, closes it after its last (updates included)."""

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step % meter.steps_per_iteration == 0:
                meter.reset()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self._t = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            meter.add("optimizer", time.perf_counter() - self._t)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % meter.steps_per_iteration == 0:
                meter.close()

    return IterationCallback()


def held_out_accuracy(model: Any, tokenizer: Any, cfg: Config) -> float:
    """DockFlow's evaluation (greedy, verifier) on the first ``eval.num_prompts`` test prompts."""
    examples = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint).test[: cfg.eval.num_prompts]
    scoring = EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed)
    return evaluate_policy(model, tokenizer, examples, scoring)["eval/test_accuracy"]


def peft_config(cfg: Config) -> Any:
    """PEFT's ``LoraConfig`` of ``model.lora`` (GRPOTrainer's ``peft_config``: the same adapters as DockFlow's
    ``with_lora``), or None for full fine-tuning."""
    lora = cfg.model.lora
    if lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")


def run_trl(
    cfg: Config, model_dir: str, work_dir: str | Path, on_iteration: Callable[[], None] | None = None
) -> TRLRun:
    """Train ``model_dir`` with TRL's GRPOTrainer for ``cfg.train.iterations`` iterations, evaluating before and
    after; ``on_iteration`` is called at the end of every iteration."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig

    torch.set_num_threads(cfg.ray.torch_threads)  # the cores DockFlow's actor gets (ND of Eq. 5)
    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(model_dir, dtype=cfg.model.dtype)
    t_eval = time.perf_counter()
    before = held_out_accuracy(model, tokenizer, cfg)
    eval_s = time.perf_counter() - t_eval
    args = trl_arguments(cfg, str(work_dir))
    meter = _Meter(args["max_steps"] // max(cfg.train.iterations, 1), on_iteration)
    trainer_cls, callback = _timed_trainer(meter)
    trainer = trainer_cls(
        model=model,
        reward_funcs=verifier_reward(meter),
        args=GRPOConfig(**args),
        train_dataset=Dataset.from_list(prompt_rows(cfg, tokenizer)),
        processing_class=tokenizer,
        callbacks=[callback],
        peft_config=peft_config(cfg),
    )
    trainer.remove_callback(PrinterCallback)  # the same logging each step, without printing it
    trainer.train()
    t_eval = time.perf_counter()
    after = held_out_accuracy(trainer.model, tokenizer, cfg)
    eval_s += time.perf_counter() - t_eval
    return TRLRun(meter.iterations, before, after, time.perf_counter() - start, eval_s)
