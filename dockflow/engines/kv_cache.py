"""The HF backend's KV cache for sampling: prompts shared by a group are prefilled once, and each step writes
its keys and values in place.

transformers' default ``DynamicCache`` concatenates every layer's keys and values with the new step's
(``torch.cat``), a copy of the whole cache per layer and step: on the 25M-parameter setup of
``benchmarks/vs_trl.py`` (32 rows x 256 new tokens) avoiding it saved about 8% of generation.
:class:`ReservedLayer` reserves room for the whole generation up front. And GRPO-style sampling asks for N
responses to each prompt, so :func:`prefill_shared_prompts` runs a prompt through the model once and gives each
of its N rows a copy of the cache, as vLLM's prefix caching does; ``generate`` then continues from there. On the
demo's batch (32 prompts x 8 samples, 8-token prompts, a few new tokens) the prefill was over half of the time
spent sampling.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from dockflow.engines.logprobs import distinct_rows, position_ids_from_mask


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views into buffers with room for ``capacity`` positions:
    ``update`` writes the new positions in place. A longer sequence doubles the buffers (one copy), so any
    length still fits."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = max(1, capacity)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._key_buffer = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[3]))
        self._value_buffer = value_states.new_empty((*value_states.shape[:2], self.capacity, value_states.shape[3]))
        self._expose(0)
        self.is_initialized = True

    def _expose(self, length: int) -> None:
        self.keys = self._key_buffer[:, :, :length]
        self.values = self._value_buffer[:, :, :length]

    def _reserve(self, length: int) -> None:
        """Room for ``length`` positions, keeping what is cached."""
        if length <= self.capacity:
            return
        filled = self.keys.shape[-2]
        self.capacity = max(length, 2 * self.capacity)
        keys, values = self.keys, self.values
        self.lazy_initialization(keys, values)
        self._key_buffer[:, :, :filled].copy_(keys)
        self._value_buffer[:, :, :filled].copy_(values)
        self._expose(filled)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        self._reserve(end)
        self._key_buffer[:, :, start:end].copy_(key_states)
        self._value_buffer[:, :, start:end].copy_(value_states)
        self._expose(end)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (repeats allowed: that is how rows sharing a prompt get their copies)."""
        if not self.is_initialized:
            return
        filled = self.keys.shape[-2]
        self._key_buffer = self._key_buffer.index_select(0, indices.to(self._key_buffer.device))
        self._value_buffer = self._value_buffer.index_select(0, indices.to(self._value_buffer.device))
        self._expose(filled)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.batch_select_indices(torch.arange(self._key_buffer.shape[0]).repeat_interleave(repeats))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


def reserved_cache(model: nn.Module, capacity: int) -> DynamicCache:
    """transformers' ``DynamicCache`` for ``model``'s layers, its full-attention layers reserved for ``capacity``
    positions (sliding-window and other special layers stay the library's own)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [ReservedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@torch.no_grad()
def prefill_shared_prompts(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: DynamicCache
) -> torch.Tensor | None:
    """Put every position of the left-padded rows but the last into ``cache``, computing each distinct row once;
    returns each row's distinct row (None: nothing prefilled), which a routing recorder applies as the cache does.

    ``generate`` called next with the same rows and this cache computes only the last position (whose logits
    give the first sampled token) and continues from there. Rows of one width and nothing to share still work:
    each is its own prompt.
    """
    width = input_ids.shape[1]
    if width < 2:
        return None
    ids, mask, copies = distinct_rows(input_ids[:, :-1], attention_mask[:, :-1])
    model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), past_key_values=cache,
          use_cache=True, logits_to_keep=1)
    cache.batch_select_indices(copies)
    return copies
