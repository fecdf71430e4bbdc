"""Generation into the dock: the rollout step the actor worker (colocated) and the generator workers
(disaggregated) share. Each chunk of prompts is sampled, tagged with the policy version that produced it,
and put into the iteration's dock window as soon as it is done, so scoring streams right behind it."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

import torch
from tensordict import TensorDict

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.engines import GenerationEngine, SamplingParams
from dockflow.workers.rollout_queue import FinishedWork, Grant, ParkedGroup, QueueSettings, RolloutQueue, Work


class PromptTable:
    """The train prompts, formatted (``PromptFormat``), and one prompt width for the run, measured at first use.
    The dock fixes a column's per-sample shape until it is fully reset, and parked groups join later iterations,
    so every rollout is padded alike. One per worker."""

    def __init__(self, templated: list[str], engine: GenerationEngine) -> None:
        self.templated = templated
        self._engine = engine

    @cached_property
    def width(self) -> int:
        return self._engine.prompt_width(self.templated)


def generation_seed(run_seed: int, iteration: int) -> int:
    """Sampling seed of one iteration: a resumed run draws the same responses as an uninterrupted one."""
    return (run_seed * 1_000_003 + iteration) % 2**62


def dock_columns(cfg: Config, out: TensorDict) -> TensorDict:
    """What generation puts into the dock: the rollout and the engine's log-probs as ``rollout_log_prob`` (TIS
    and the rollout-vs-trainer drift metric read them), also as ``old_log_prob`` when ``train.old_log_prob:
    rollout`` (then no actor pass recomputes them); with tools, each trajectory's ``tool_record`` (its
    conversation and environment, for the reward functions)."""
    cols = out.select("input_ids", "attention_mask", "responses", "response_mask")
    cols["rollout_log_prob"] = out["rollout_log_prob"]
    if cfg.train.old_log_prob == "rollout":
        cols["old_log_prob"] = out["rollout_log_prob"]
    if "tool_record" in out.keys():
        cols["tool_record"] = out["tool_record"]
    return cols


def clipped_rows(out: TensorDict) -> int:
    """Responses that filled their whole width (``rollout.max_new_tokens``; a tool trajectory's token budget):
    cut at the limit, not ended by the model."""
    return int((out["response_length"] >= out["responses"].shape[1]).sum())


def rollout_metrics(prompt_tokens: int, response_tokens: int, samples: int, start: float,
                    clipped: int) -> dict[str, float]:
    """What a generation round reports: its time and mean token lengths (for Eq. 5 throughput), and the share of
    responses cut at the length limit (``rollout/clipped_ratio``, from :func:`clipped_rows`)."""
    out = {
        "timing/generate_s": time.perf_counter() - start,
        "rollout/samples": float(samples),
        "rollout/prompt_length": prompt_tokens / samples,
        "rollout/response_length": response_tokens / samples,
        "rollout/tokens": float(prompt_tokens + response_tokens),
    }
    out["rollout/clipped_ratio"] = clipped / samples
    return out


class RolloutQueueTimeout(RuntimeError):
    """The generators' shared rollout queue did not answer in time."""


class QueueClient:
    """A :class:`RolloutQueue` in this process, or its Ray actor (several generators), called alike; an actor that
    does not answer within ``timeout_s`` (``train.stage_timeout_s``) raises :class:`RolloutQueueTimeout`."""

    def __init__(self, queue: Any, timeout_s: float = 60.0) -> None:
        self.queue, self.timeout_s = queue, timeout_s

    def take(self, iteration: int, rank: int) -> Work | None:
        return self._call(self.queue.take, iteration, rank, iteration=iteration)

    def finish(self, done: FinishedWork) -> Grant:
        return Grant(*self._call(self.queue.finish, done, iteration=done.iteration))

    def park(self, groups: list[ParkedGroup]) -> None:
        self._call(self.queue.park, groups)

    def stats(self, iteration: int) -> dict[str, Any]:
        return self._call(self.queue.stats, iteration, iteration=iteration)

    def state_dict(self) -> dict[str, Any]:
        return self._call(self.queue.state_dict)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._call(self.queue.load_state_dict, state)

    def _call(self, method: Callable[..., Any] | Any, *args: Any, iteration: int | None = None) -> Any:
        """``method(*args)`` on the local queue, or ``method.remote(*args)`` on the actor, waited for."""
        if not hasattr(method, "remote"):
            return method(*args)
        import ray

        try:
            return ray.get(method.remote(*args), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            name = getattr(method, "_method_name", "a call")  # Ray's ActorMethod keeps its method's name there
            which = "" if iteration is None else f" for iteration {iteration}"
            raise RolloutQueueTimeout(
                f"the rollout queue actor did not answer '{name}'{which} within {self.timeout_s:.0f}s "
                "(train.stage_timeout_s); is the '<run>-rollout-queue' actor alive?"
            ) from None


def generate_into_dock(
    cfg: Config,
    engine: GenerationEngine,
    dock: TransferDock,
    table: PromptTable,
    *,
    iteration: int,
    prompt_ids: list[int],
    first_index: int,
    policy_version: int,
    queue: QueueClient | None = None,
    rank: int = 0,
    window_start: int,
) -> dict[str, float]:
    """Sample N responses for each of ``prompt_ids`` and stream them into the dock, chunk by chunk, from
    index ``first_index`` of ``iteration``'s window (which starts at dock index ``window_start``: the plan's
    ``dock_window(iteration)[0]``) on. Chunks come from ``queue`` (shared by several
    generators, already opened for the iteration; None: a private one): chunk k always holds the same prompts,
    seed and dock slice, whoever takes it."""
    start = time.perf_counter()
    ro = cfg.rollout
    if queue is None:
        own = RolloutQueue(QueueSettings(max(1, ro.batch_size // ro.group_size)))
        own.open(iteration, prompt_ids)
        queue = QueueClient(own)
    prompts = [table.templated[i] for i in prompt_ids]
    params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=ro.group_size)
    seed = generation_seed(cfg.run.seed, iteration) + first_index
    prompt_tokens = response_tokens = samples = chunks = clipped = 0
    while (work := queue.take(iteration, rank)) is not None:
        c, count = work.offset, len(work.prompt_ids)
        out = engine.generate(prompts[c : c + count], params, seed + c, prompt_width=table.width)
        first = window_start + first_index + work.slot * ro.group_size
        indices = list(range(first, first + out.batch_size[0]))
        meta = {
            "prompt_id": torch.tensor(work.prompt_ids).repeat_interleave(ro.group_size),
            "response_length": out["response_length"],
            "policy_version": torch.full((len(indices),), policy_version),
        }
        dock.put(indices, dock_columns(cfg, out), meta)
        prompt_tokens += int(out["prompt_length"].sum())
        response_tokens += int(out["response_length"].sum())
        clipped += clipped_rows(out)
        samples += len(indices)
        chunks += 1
    out = rollout_metrics(prompt_tokens, response_tokens, max(samples, 1), start, clipped)
    out["rollout/samples"] = float(samples)
    out[f"flow/chunks_generator_{rank}"] = float(chunks)
    return out
