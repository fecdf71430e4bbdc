"""The log-prob of each token ``generate`` samples, kept one decoding step at a time.

``generate(output_logits=True)`` keeps every step's logits: [rows, new tokens, vocabulary], 19 GiB in fp32 for 16
rows of 2,048 tokens at Qwen2.5's 151,936-token vocabulary. Only the sampled token's log-prob is needed, and that
token is the next step's input. So a hook on the lm_head keeps one step's ``log_softmax`` (the raw logits over the
temperature, as ``output_logits`` gave them: before top-p), and a pre-hook on the model reads the token the step
sampled from the next forward's ``input_ids``; the last step's token is read from the returned sequences.

    with SampledLogProbs(model, temperature) as recorder:
        out = model.generate(...)
    logp = recorder.log_probs(out.sequences[:, -1])      # [rows, steps]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class SampledLogProbs:
    """Records the sampled tokens' log-probs during one ``generate`` call (a context manager; see the module doc)."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        self.model, self.temperature = model, temperature
        self._last: torch.Tensor | None = None  # the latest step's log-probs over the vocabulary [rows, V]
        self._steps: list[torch.Tensor] = []
        self._hooks: list[Any] = []

    def __enter__(self) -> SampledLogProbs:
        self._hooks = [
            self.model.register_forward_pre_hook(self._read_input, with_kwargs=True),
            self.model.get_output_embeddings().register_forward_hook(self._keep_logits),
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for hook in self._hooks:
            hook.remove()

    def _read_input(self, _module: nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        if self._last is not None:  # this forward's input is the token the last step sampled
            self._steps.append(self._last.gather(-1, kwargs["input_ids"][:, -1:].to(self._last.device)).squeeze(-1))

    def _keep_logits(self, _module: nn.Module, _inputs: Any, logits: torch.Tensor) -> None:
        self._last = torch.log_softmax(logits[:, -1].float() / self.temperature, dim=-1)

    def log_probs(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[rows, steps]: each step's sampled token's log-prob; ``last_tokens`` are the final step's tokens."""
        if self._last is None:
            raise RuntimeError("SampledLogProbs saw no forward pass: generate() did not run inside it")
        final = self._last.gather(-1, last_tokens[:, None].to(self._last.device)).squeeze(-1)
        return torch.stack([*self._steps, final], dim=1).cpu()
