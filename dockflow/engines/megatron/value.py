"""PPO's critic on megatron-core: the ``GPTModel`` trunk with a scalar value head in place of ``output_layer``, and
:class:`MegatronCriticEngine`, the critic's :class:`TrainingEngine` over it.

The Hugging Face critic (``dockflow.models.load_critic``: ``AutoModelForTokenClassification`` with one label) names
the trunk ``model.*`` and the head ``score.weight`` (``score.bias`` where the family has one); here the trunk is
the policy's megatron state (``convert.hf_to_megatron`` without ``lm_head``) and the head is
``output_layer.head.*``, replicated on every TP rank (the final hidden states are full on each), on the last
pipeline stage. The head starts at zero like ``load_critic``'s; built from an HF critic it takes its weights.
Checkpoints go through ``dist_checkpointing`` as the policy's (``persist.py``): the value model's sharded state dict
is the trunk's sharding with the head replicated (``value_sharded_state_dict``), so a critic saved at one TP / PP
loads at another.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import MethodType
from typing import Any

import torch
from torch import nn

from dockflow.engines.logprobs import TokenOutputs
from dockflow.engines.megatron import model as mg
from dockflow.engines.megatron.convert import DecoderSpec, hf_to_megatron, megatron_to_hf, spec_from_hf
from dockflow.engines.megatron.training import MegatronTrainingEngine

HEAD = "output_layer.head."  # megatron-side names of the value head's weight and bias
HF_HEAD = "score."


class ValueHead(nn.Module):
    """One value per position from the last stage's final hidden states [S, B, H] -> [S, B, 1]; returns
    ``(values, None)`` as megatron's output layers do."""

    def __init__(self, hidden_size: int, bias: bool, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.head = nn.Linear(hidden_size, 1, bias=bias, dtype=dtype)
        with torch.no_grad():  # every value 0 at the start, as ``load_critic``'s head
            self.head.weight.zero_()
            if self.head.bias is not None:
                self.head.bias.zero_()

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None):
        return self.head(hidden), None


def critic_spec(config: Any) -> DecoderSpec:
    """The trunk's spec: the policy's, untied (a critic has no output embedding to share)."""
    return replace(spec_from_hf(config), tied=False)


def value_sharded_state_dict(model: Any, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
    """The value model's sharded state dict for ``dist_checkpointing``: megatron's default over its submodules (the
    trunk sharded as the policy's; the head, a plain module, replicated over TP and DP). ``GPTModel``'s own adds
    the vocabulary projection's padding flags to ``output_layer.weight``, which the head does not have (a
    KeyError), and nothing else for an untied model without multi-token prediction."""
    from megatron.core.transformer.module import MegatronModule

    return MegatronModule.sharded_state_dict(model, prefix, sharded_offsets, metadata)


def build_value_model(spec: DecoderSpec, tp: int = 1, pp: int = 1, bias: bool = True, *,
                      recompute: bool = False) -> Any:
    """This rank's ``GPTModel`` with a :class:`ValueHead` for ``output_layer`` on the last stage (applied by
    :func:`response_values` to the final hidden states the model returns), checkpointed by
    ``value_sharded_state_dict``; ``recompute``: full activation recompute."""
    model = mg.build_gpt_model(spec, tp=tp, pp=pp, recompute=recompute)
    if model.post_process:
        model.output_layer = ValueHead(spec.hidden_size, bias)
    model.sharded_state_dict = MethodType(value_sharded_state_dict, model)
    return model


def critic_to_megatron(hf: dict[str, torch.Tensor], spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """An HF critic's state dict to the full megatron value model's state (TP=1, vocabulary unpadded)."""
    out = hf_to_megatron(hf, replace(spec, tied=True))  # the trunk; tied: there is no lm_head to take
    for key in ("weight", "bias"):
        if HF_HEAD + key in hf:
            out[HEAD + key] = hf[HF_HEAD + key]
    if HEAD + "weight" not in out:
        raise KeyError("megatron critic: the state has no 'score.weight'; load the critic with load_critic")
    return out


def megatron_to_critic(full: dict[str, torch.Tensor], spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """The inverse of :func:`critic_to_megatron`: HF critic names."""
    out = megatron_to_hf(full, replace(spec, tied=True))
    del out["lm_head.weight"]  # the embedding itself under a tied name; a critic has none
    for key in ("weight", "bias"):
        if HEAD + key in full:
            out[HF_HEAD + key] = full[HEAD + key]
    return out


def response_values(model: Any, hidden: torch.Tensor, ids: torch.Tensor, keep_r: int) -> TokenOutputs:
    """The kept response columns' values [B, keep_r] from the value model's final hidden states [S, B, H]: its head
    on the positions whose logits would predict each response token, as ``dockflow.engines.logprobs.response_values``."""
    values, _ = model.output_layer(hidden[-keep_r - 1 : -1])
    return TokenOutputs(values[..., 0].transpose(0, 1).float())


class MegatronCriticEngine(MegatronTrainingEngine):
    """This rank's TP / PP shard of the value model and its AdamW state; the update, the clipping and the optimizer
    are the policy engine's, on the values instead of log-probs. The HF critic (``policy_module``) takes the
    gathered weights when read (no generation layout: the critic does not generate)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        tp: int = 1,
        pp: int = 1,
        lr: float,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        infer_batch_size: int = 64,
        device: str = "cpu",
        seed: int = 0,
        gradient_checkpointing: bool = False,
        max_tokens_per_micro_batch: int | None = None,
    ):
        """``model``: the HF critic (``load_critic``) every rank starts from; it becomes the gathered copy.
        ``gradient_checkpointing``: megatron's full activation recompute, every layer; ``max_tokens_per_micro_batch``:
        micro-batches by tokens, as the policy engine's."""
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self._init_ranks(tp, pp, seed, device)
        self.spec = critic_spec(model.config)
        state = model.state_dict()
        self.model = build_value_model(self.spec, tp=tp, pp=pp, bias=HF_HEAD + "bias" in state,
                                       recompute=gradient_checkpointing).to(self.device)
        mg.load_full_state(self.model, critic_to_megatron(state, self.spec), self.spec)
        del state
        for p in model.parameters():  # filled when read (``policy_module``): no second copy on the device
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)
        self.generation_model = model.to(self.device).eval()  # its buffers on the device
        self.temperature = 1.0
        self._init_training(lr, weight_decay, grad_clip, infer_batch_size)
        self._head = response_values
        self._gathered = False

    @classmethod
    def from_pretrained(cls, path: str | Path, **engine_args: Any) -> MegatronCriticEngine:
        """The engine over the critic ``load_critic`` makes from the HF directory ``path`` (fp32)."""
        from dockflow.models import load_critic

        return cls(load_critic(path), **engine_args)

    def policy_module(self) -> nn.Module:
        """The HF critic with the current weights (collective: gathers them after an update)."""
        self._to_generation()
        return self.generation_model

    def _gather_hf(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return megatron_to_critic(mg.gather_full(local, self.spec), self.spec)

    def _local_from_hf(self, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return mg.local_shard(critic_to_megatron(hf, self.spec), self.spec)

    def _to_generation(self) -> None:
        """Gather (collective) the full weights into the HF critic, once per change."""
        if self._gathered:
            return
        hf = self._gather_hf({n: p.detach() for n, p in self.model.named_parameters()})
        for name, param in self.generation_model.named_parameters():
            param.data = hf[name]
        self._gathered = True

    def _to_update(self) -> None:
        self._gathered = False  # the update is about to change the weights (or load others)

    @contextmanager
    def _update_on_device(self) -> Iterator[None]:
        yield  # the update state never leaves the device here
