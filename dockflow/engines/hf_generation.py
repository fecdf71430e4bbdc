"""Generation with transformers' ``generate`` (batched, KV cache, temperature / top-p, stop at EOS).

This is the CPU backend of :class:`GenerationEngine`; it shares the policy module with the training
engine when both live in one worker (colocated), so loading weights is a copy into the same tensors. Rows that
share a prompt (a group's N samples) are prefilled once, into a KV cache written in place (``kv_cache``). A
mixture-of-experts policy's routing is recorded as it samples (``routed_experts``, ``routing``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext

import torch
from tensordict import TensorDict
from torch import nn

from dockflow.engines.interfaces import GenerationEngine, SamplingParams
from dockflow.engines.lora import causal_lm
from dockflow.engines.routing import NOT_RECORDED, RoutingRecorder, moe_routers
from dockflow.engines.sampled_log_probs import SampledLogProbs
from dockflow.engines.sync_check import reference_log_probs
from dockflow.engines.token_layout import decode_responses, first_eos_mask, left_pad_prompts, rollout_batch


class HFGenerationEngine(GenerationEngine):
    """Batched sampling with ``model.generate`` on one device; also returns the sampled tokens' log-probs."""

    def __init__(self, model: nn.Module, tokenizer, device: str | torch.device = "cpu", batch_size: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.batch_size = batch_size
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs pad and eos tokens for batched generation")

    def _encode_prompts(self, prompts: list[str], width: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        return left_pad_prompts(self.tokenizer, prompts, width)

    def prompt_width(self, prompts: list[str]) -> int:
        """Token width that fits every prompt."""
        return max(len(self.tokenizer(p)["input_ids"]) for p in prompts)

    @torch.no_grad()
    def generate(
        self, prompts: list[str], params: SamplingParams, seed: int, prompt_width: int | None = None
    ) -> TensorDict:
        prompt_ids, prompt_mask = self._encode_prompts(prompts, prompt_width)
        prompt_ids = prompt_ids.repeat_interleave(params.n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(params.n, dim=0)
        tokens, logp, routed = self._sample(prompt_ids, prompt_mask, params.max_new_tokens, params, seed)
        eos = self.tokenizer.eos_token_id
        response_mask = first_eos_mask(tokens, eos)
        responses = torch.where(response_mask.bool(), tokens, torch.full_like(tokens, self.tokenizer.pad_token_id))
        out = rollout_batch(prompt_ids, prompt_mask, responses, response_mask)
        out["rollout_log_prob"] = logp * response_mask
        if routed is not None:  # padding (and what generate fed after a row's EOS) is not the rollout's
            out["routed_experts"] = routed.masked_fill(~out["attention_mask"].bool()[..., None, None], NOT_RECORDED)
        return out

    @property
    def records_routing(self) -> bool:
        """Whether :meth:`generate` returns ``routed_experts``: the policy is a mixture of experts."""
        return bool(moe_routers(self.model))

    def sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, params: SamplingParams,
        seed: int, generated: torch.Tensor | None = None, row_caps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Continue left-padded rows by up to ``max_new_tokens`` sampled tokens: (tokens, their log-probs), both
        [B, max_new_tokens]; tokens after a row's EOS are padding. Log-probs are of the raw logits divided by
        the temperature (1 when greedy), as ``dockflow.engines.logprobs`` computes them."""
        return self._sample(input_ids, attention_mask, max_new_tokens, params, seed, record=False)[:2]

    @torch.no_grad()
    def _sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, params: SamplingParams,
        seed: int, *, record: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """:meth:`sample`, and with ``record`` for an MoE policy each position's recorded experts [B, width +
        max_new_tokens, L, K] (-1 past the last position fed to the model)."""
        from dockflow.engines.kv_cache import prefill_shared_prompts, reserved_cache  # imports transformers

        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        tokens = torch.full((input_ids.shape[0], max_new_tokens), pad, dtype=torch.long)
        logp = torch.zeros((input_ids.shape[0], max_new_tokens), dtype=torch.float32)
        temperature = 1.0 if params.greedy else params.temperature
        gen = torch.Generator().manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        model = causal_lm(self.model)  # what generate() runs: a LoRA model's HF module (its adapters on)
        routers = moe_routers(model) if record else []
        routed = None if not routers else torch.full(
            (input_ids.shape[0], input_ids.shape[1] + max_new_tokens, len(routers), routers[0].top_k), NOT_RECORDED,
            dtype=torch.int16)
        try:
            for start in range(0, input_ids.shape[0], self.batch_size):
                sl = slice(start, start + self.batch_size)
                # generate() samples from the global RNG; seed it per chunk from our own generator.
                torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
                ids, mask = input_ids[sl].to(self.device), attention_mask[sl].to(self.device)
                cache = reserved_cache(model, ids.shape[1] + max_new_tokens)
                routes = RoutingRecorder(model, routers) if routers else None
                with routes or nullcontext():
                    copies = prefill_shared_prompts(model, ids, mask, cache)
                    if routes is not None and copies is not None:
                        routes.select_rows(copies)  # the prefill ran each distinct prompt once
                    with SampledLogProbs(model, temperature) as recorder:  # one step's logits at a time
                        sequences = model.generate(
                            input_ids=ids,
                            attention_mask=mask,
                            past_key_values=cache,
                            max_new_tokens=max_new_tokens,
                            do_sample=not params.greedy,
                            temperature=None if params.greedy else params.temperature,
                            top_p=None if params.greedy else params.top_p,
                            top_k=None,
                            pad_token_id=pad,
                            eos_token_id=eos,
                        )
                new = sequences[:, input_ids.shape[1]:].cpu()
                tokens[sl, : new.shape[1]] = new
                logp[sl, : new.shape[1]] = recorder.log_probs(new[:, -1])
                if routes is not None:
                    routed[sl] = routes.routed(routed.shape[1])
        finally:
            self.model.train(was_training)
        return tokens, logp, routed

    def decode(self, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return decode_responses(self.tokenizer, responses, response_mask)

    @torch.no_grad()
    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        for name, tensor in weights:
            target = params[name]
            if target.data_ptr() != tensor.data_ptr():
                target.copy_(tensor)

    def samples_with(self, module: nn.Module) -> bool:
        return self.model is module

    def probe_log_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        return reference_log_probs(self.model, tokens)
