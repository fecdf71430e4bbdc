"""SFT warm start: teach the policy the answer format on the scarce labeled subset before RL.

Teacher forcing on ``task.labeled`` (loss on the answer tokens and EOS only), greedy accuracy on
``task.val`` every ``sft.eval_every_epochs`` epochs, early stop after ``sft.patience`` validations
without a new best (or at ``sft.target_val_accuracy``, else 100%), keep the best weights. What is
validated and kept is the moving average of the weights (``sft.ema_decay``, one more copy of the model
while SFT runs; 0: the weights themselves, no copy). With ``tools:`` the labeled rows' tool-use
demonstrations are trained on their model tokens and validated through the tool loop (``dockflow.flow.tool_sft``).
The result is an HF model directory in ``sft.cache_dir/<key>``, where the key hashes everything the result depends
on (model, data, template, SFT settings, seed, response length, file contents; the tools, their limits and the
code of the tools and demonstrations); a later call with the same inputs returns it at
once (``cached=True``). The directory is written to a temp dir and renamed, so a crash never leaves a
half-written cache entry.

    inputs = SFTInputs(cfg.model, cfg.data, cfg.sft, cfg.checkpoint, cfg.run.seed, cfg.rollout.max_new_tokens,
                       cfg.eval.batch_size, cfg.tools)
    result = sft_warm_start(inputs, run_dir)
    model, tok = load_model_and_tokenizer(result.model_dir)
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dockflow.agents import tool_spec
from dockflow.config.data import DataConfig
from dockflow.config.sections import CheckpointConfig, ModelConfig, SFTConfig
from dockflow.config.tools import ToolsConfig
from dockflow.data import Example, PromptFormat, load_task
from dockflow.eval.greedy import greedy_accuracy
from dockflow.eval.tool_scores import tool_scores
from dockflow.flow.tool_sft import ToolDemonstrations, encode_trajectories
from dockflow.models.chat_template import TINY_CHAT_VERSION
from dockflow.models.factory import build_tiny_model, load_model_and_tokenizer, save_pretrained_dir
from dockflow.models.tokenizer import build_char_tokenizer, build_task_tokenizer, with_chat_template
from dockflow.rewards.verifier import task_verifier
from dockflow.storage.objects import fetch_model, file_fingerprint, is_s3_uri, model_fingerprint

# Bump when the training procedure changes, so old cache entries are not reused.
SFT_VERSION = 1
RESULT_FILE = "sft_result.json"


@dataclass(frozen=True)
class SFTInputs:
    """What the warm start reads of a run's config: the model, data and SFT sections, the S3 settings of their
    files (``checkpoint``), the seed (``run.seed``), the response length (``rollout.max_new_tokens``), the
    validation's batch size (``eval.batch_size``) and the ``tools`` section (with tools: SFT on tool-use
    demonstrations, validated through the tool loop: ``dockflow.flow.tool_sft``)."""

    model: ModelConfig
    data: DataConfig
    sft: SFTConfig
    storage: CheckpointConfig
    seed: int
    max_new_tokens: int
    eval_batch_size: int
    tools: ToolsConfig = field(default_factory=ToolsConfig)


@dataclass
class SFTResult:
    """Where the warm-started model is, its best validation accuracy, per-validation history, cache hit."""

    model_dir: Path
    val_accuracy: float
    history: list[dict[str, Any]] = field(default_factory=list)
    cached: bool = False


def sft_cache_key(inputs: SFTInputs) -> str:
    """Hash of every input the SFT result depends on. Local files count by their sha256; an ``s3://`` model by its
    URI and manifest digest (or its objects' ETags), ``s3://`` data files by the sha256 in their metadata (or
    their ETag): nothing is downloaded here."""
    model = inputs.model.model_dump()
    model["lora"] = None  # the warm start trains the whole model before model.lora wraps it: LoRA runs share it
    path, data, storage = inputs.model.path, inputs.data, inputs.storage
    if path and is_s3_uri(path):
        model["path"] = path.rstrip("/")
        model["content"] = model_fingerprint(path, storage)
        model.pop("tiny")
    elif path:
        model["path"] = str(Path(path).resolve())
        model.pop("tiny")
    elif inputs.model.tiny.architecture == "qwen2":  # the MoE keys do not change a dense model (nor its cache key)
        for key in ("architecture", "num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            model["tiny"].pop(key)
    key = {
        "version": SFT_VERSION,
        "seed": inputs.seed,
        "model": model,
        "data": data.model_dump(),
        "data_files": [file_fingerprint(p, storage) for p in (data.train_path, data.test_path)]
        if data.source == "file"
        else None,
        "sft": inputs.sft.model_dump(exclude={"cache_dir", *(() if inputs.sft.demonstrations else ("demonstrations",))}),
        "max_new_tokens": inputs.max_new_tokens,
    }
    if inputs.tools.enabled:  # the tools, the loop's limits, and the code of the tools and demonstrations
        key["tiny_chat"] = TINY_CHAT_VERSION  # the tiny tool template's version
        key["tools"] = inputs.tools.model_dump(exclude={"record_bytes"})
        key["code"] = code_fingerprints([*inputs.tools.paths, *filter(None, [inputs.sft.demonstrations])])
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def code_fingerprints(paths: list[str]) -> dict[str, str]:
    """The sha256 of the source file of each ``module:attribute`` (its module imported), so a cached warm start
    is not reused after the tools or the demonstrations changed."""
    import importlib

    out = {}
    for p in paths:
        module = importlib.import_module(p.partition(":")[0])
        source = getattr(module, "__file__", None)
        out[p] = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16] if source else "builtin"
    return out


def _initial_model(
    inputs: SFTInputs, demos: ToolDemonstrations | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``model.path`` (an ``s3://`` one fetched, checked, into the node's cache), else a fresh tiny model (whose
    tokenizer also learns its merges from the tool-use ``demos``, rendered)."""
    m = inputs.model
    if m.path:
        path = fetch_model(m.path, inputs.storage) if is_s3_uri(m.path) else m.path
        return load_model_and_tokenizer(path, dtype=m.dtype)
    extra = demos.corpus(with_chat_template(build_char_tokenizer())) if demos is not None else []
    tokenizer = build_task_tokenizer(inputs.data, inputs.seed, m.tiny.tokenizer_merges, inputs.storage, extra,
                                     tools=inputs.tools.enabled)
    return build_tiny_model(m.tiny, tokenizer, seed=inputs.seed, dtype=m.dtype), tokenizer


def encode_sft_batch(
    tokenizer: PreTrainedTokenizerBase, examples: list[Example], fmt: PromptFormat
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask``/``labels``; labels are -100 except answer + EOS."""
    rows = []
    for ex in examples:
        prompt = tokenizer(fmt.render(ex.prompt, tokenizer))["input_ids"]
        answer = tokenizer(ex.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


class WeightAverage:
    """The exponential moving average of ``model``'s weights after each optimizer step (``sft.ema_decay``), with
    the usual warm-up of the decay, ``min(decay, (1 + t) / (10 + t))`` at step t, so a short run is not averaged
    towards its initial weights. Decay 0 is the weights themselves (``model`` is not copied)."""

    def __init__(self, model: PreTrainedModel, decay: float) -> None:
        self.source, self.decay, self.steps = model, decay, 0
        self.model = model if decay == 0 else copy.deepcopy(model)

    def update(self) -> None:
        self.steps += 1
        if self.model is self.source:
            return
        decay = min(self.decay, (1 + self.steps) / (10 + self.steps))
        with torch.no_grad():
            for average, weight in zip(self.model.parameters(), self.source.parameters(), strict=True):
                average.lerp_(weight.detach(), 1.0 - decay)


def _train_epoch(
    model: PreTrainedModel,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    batches: list[dict[str, torch.Tensor]],
    average: WeightAverage,
) -> float:
    model.train()
    total = 0.0
    for batch in batches:
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        average.update()
        total += loss.item()
    return total / max(len(batches), 1)


def _make_batches(
    tokenizer: PreTrainedTokenizerBase, examples: list[Example], fmt: PromptFormat, batch_size: int, gen: torch.Generator
) -> list[dict[str, torch.Tensor]]:
    perm = torch.randperm(len(examples), generator=gen).tolist()
    chunks = [perm[i : i + batch_size] for i in range(0, len(perm), batch_size)]
    return [encode_sft_batch(tokenizer, [examples[j] for j in c], fmt) for c in chunks]


def _tool_steps(
    inputs: SFTInputs, tokenizer: PreTrainedTokenizerBase, demos: ToolDemonstrations, val: list[Example],
) -> tuple[Callable[[torch.Generator], list[dict[str, torch.Tensor]]], Callable[[PreTrainedModel], float]]:
    """(batches of an epoch, validation accuracy) of a tool run: the demonstrations' trajectories trained on their
    model tokens; accuracy through the tool loop with the real tools."""
    spec = tool_spec(inputs.tools, tokenizer)
    trajectories = demos.trajectories(tokenizer, spec)
    fmt, verifier, bs = PromptFormat.of(inputs.data), task_verifier(inputs.data), inputs.sft.batch_size

    def batches(gen: torch.Generator) -> list[dict[str, torch.Tensor]]:
        perm = torch.randperm(len(trajectories), generator=gen).tolist()
        chunks = [perm[i : i + bs] for i in range(0, len(perm), bs)]
        return [encode_trajectories([trajectories[j] for j in c], tokenizer.pad_token_id) for c in chunks]

    def evaluate(model: PreTrainedModel) -> float:
        return tool_scores(model, tokenizer, val, spec, fmt=fmt, verifier=verifier,
                           max_new_tokens=inputs.max_new_tokens, batch_size=inputs.eval_batch_size)["accuracy"]

    return batches, evaluate


def train_sft(
    inputs: SFTInputs,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    labeled: list[Example],
    val: list[Example],
    demos: ToolDemonstrations | None = None,
) -> tuple[float, list[dict[str, Any]]]:
    """Train ``model`` in place with early stopping; leaves it holding the best validated weights (of the moving
    average, ``sft.ema_decay``). With tool-use ``demos`` it trains on them (``dockflow.flow.tool_sft``) and
    validates through the tool loop.

    Returns (best validation accuracy, history of ``{epoch, loss, val_accuracy, seconds}`` per validation).
    """
    s, fmt, verifier = inputs.sft, PromptFormat.of(inputs.data), task_verifier(inputs.data)
    gen = torch.Generator().manual_seed(inputs.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    # Warm-up matters here: without it the tiny model stalls at a few percent for dozens of epochs.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / max(s.warmup_steps, 1)))

    def make_batches(g: torch.Generator) -> list[dict[str, torch.Tensor]]:
        return _make_batches(tokenizer, labeled, fmt, s.batch_size, g)

    def evaluate(candidate: PreTrainedModel) -> float:
        return greedy_accuracy(
            candidate, tokenizer, val, inputs.eval_batch_size, inputs.max_new_tokens, fmt, verifier
        )

    if demos is not None:
        make_batches, evaluate = _tool_steps(inputs, tokenizer, demos, val)

    start = time.perf_counter()
    # At a constant learning rate the weights' validation accuracy swings 10-20 points from one validation to the
    # next, and a slow seed's weights keep memorising; their average climbs smoothly and generalises further
    # (docs/data_and_models.md, 'Over seeds').
    average = WeightAverage(model, s.ema_decay)
    best_acc, best_state, bad = evaluate(average.model), copy.deepcopy(model.state_dict()), 0
    history: list[dict[str, Any]] = [{"epoch": 0, "loss": None, "val_accuracy": best_acc, "seconds": 0.0}]
    epochs = s.max_epochs if (s.enabled and labeled) else 0
    bar = tqdm(range(1, epochs + 1), desc="sft", unit="epoch", leave=False)
    for epoch in bar:
        loss = _train_epoch(model, opt, sched, make_batches(gen), average)
        bar.set_postfix(loss=f"{loss:.3f}", best=f"{best_acc:.3f}")
        if epoch % s.eval_every_epochs and epoch != epochs:
            continue
        acc = evaluate(average.model)
        history.append(
            {"epoch": epoch, "loss": loss, "val_accuracy": acc, "seconds": round(time.perf_counter() - start, 2)}
        )
        if acc > best_acc:
            best_acc, best_state, bad = acc, copy.deepcopy(average.model.state_dict()), 0
            if acc >= (s.target_val_accuracy or 1.0):  # the competence asked for, or nothing left to improve
                break
        else:
            bad += 1
            if bad >= s.patience:
                break
    bar.close()
    model.load_state_dict(best_state)
    return best_acc, history


class SFTNotLearnedError(RuntimeError):
    """The warm start's best validation accuracy stayed below ``sft.min_val_accuracy``."""


def check_learned(result: SFTResult, floor: float | None) -> None:
    """Raise ``SFTNotLearnedError`` (one line) when ``result`` is below the ``sft.min_val_accuracy`` floor."""
    if floor is not None and result.val_accuracy < floor:
        raise SFTNotLearnedError(
            f"the SFT warm start reached {result.val_accuracy:.1%} validation accuracy, below "
            f"sft.min_val_accuracy={floor:.1%} ({result.model_dir}): it has not learned the task, and RL would start "
            "from almost nothing; check the labeled data and the sft settings, or lower sft.min_val_accuracy"
        )


def sft_warm_start(inputs: SFTInputs, run_dir: str | Path) -> SFTResult:
    """Warm-start the policy (or return the cached result) and write a summary to ``run_dir/sft.json``.

    With ``sft.enabled: false`` the initial model is evaluated and saved as is, so callers always get a
    model directory.
    """
    final = Path(inputs.sft.cache_dir) / sft_cache_key(inputs)
    if (final / RESULT_FILE).is_file():
        saved = json.loads((final / RESULT_FILE).read_text())
        result = SFTResult(final, saved["val_accuracy"], saved["history"], cached=True)
    else:
        task = load_task(inputs.data, inputs.seed, storage=inputs.storage)
        demos = None
        if inputs.tools.enabled:
            demos = ToolDemonstrations(inputs.data, inputs.tools, inputs.sft.demonstrations, task.labeled)
        model, tokenizer = _initial_model(inputs, demos)
        val_acc, history = train_sft(inputs, model, tokenizer, task.labeled, task.val, demos)
        summary = {"val_accuracy": val_acc, "history": history, "key": final.name}
        save_pretrained_dir(model, tokenizer, final, extra_files={RESULT_FILE: json.dumps(summary, indent=1)})
        result = SFTResult(final, val_acc, history, cached=False)
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    (run / "sft.json").write_text(json.dumps({**asdict(result), "model_dir": str(result.model_dir)}, indent=1))
    return result


def sft_report(inputs: SFTInputs, run_dir: str | Path, test_prompts: int) -> tuple[list[str], SFTResult]:
    """Run (or reuse) the warm start, then score its model greedily on the first ``test_prompts`` test prompts:
    (the lines ``dockflow sft`` prints: one per validation, then model directory, cache hit, seconds, accuracies;
    the warm start's result)."""
    start = time.perf_counter()
    result = sft_warm_start(inputs, run_dir)
    seconds = time.perf_counter() - start
    model, tokenizer = load_model_and_tokenizer(result.model_dir, dtype=inputs.model.dtype)
    test = load_task(inputs.data, inputs.seed, storage=inputs.storage).test[:test_prompts]
    fmt, verifier, tools = PromptFormat.of(inputs.data), task_verifier(inputs.data), ""
    if inputs.tools.enabled:
        scores = tool_scores(model, tokenizer, test, tool_spec(inputs.tools, tokenizer), fmt=fmt, verifier=verifier,
                             max_new_tokens=inputs.max_new_tokens, batch_size=inputs.eval_batch_size)
        test_acc = scores["accuracy"]
        tools = f" tool_calls={scores['tool_calls']:.2f} tool_errors={scores['tool_errors']:.2f} (per trajectory)"
    else:
        test_acc = greedy_accuracy(
            model, tokenizer, test, inputs.eval_batch_size, inputs.max_new_tokens, fmt, verifier
        )
    lines = []
    for h in result.history:
        loss = "   -  " if h["loss"] is None else f"{h['loss']:.4f}"
        lines.append(f"epoch {h['epoch']:4d}  loss {loss}  val {h['val_accuracy']:.3f}  t {h['seconds']}s")
    lines.append(
        f"model_dir={result.model_dir} cached={result.cached} sft_seconds={seconds:.1f} "
        f"val_accuracy={result.val_accuracy:.3f} test_accuracy={test_acc:.3f} (n={len(test)}){tools}"
    )
    return lines, result
