"""The config's checks of a mixture-of-experts policy on the megatron engine: ``train.ep`` and
``train.moe_aux_loss_coeff`` against the engine and the tiny model (a model from ``model.path`` is checked by the
engine at start, ``engines/megatron``)."""

from __future__ import annotations

from typing import Any


def check_moe(cfg: Any) -> None:
    """One line for expert parallelism or a load-balancing loss the run cannot have (``cfg``: the ``Config``)."""
    tc = cfg.train
    tiny = cfg.model.tiny if cfg.model.path is None else None
    dense = tiny is not None and tiny.architecture != "qwen3_moe"
    if tc.moe_aux_loss_coeff > 0 and (tc.engine != "megatron" or dense):
        raise ValueError(f"train.moe_aux_loss_coeff={tc.moe_aux_loss_coeff} weighs megatron's load-balancing loss "
                         "of a mixture of experts: set train.engine=megatron and a qwen3_moe model, or 0")
    if tc.ep == 1:
        return
    if tc.engine != "megatron" or (tc.dp * tc.tp) % tc.ep:
        raise ValueError(f"train.ep={tc.ep} splits the experts over megatron's data-parallel ranks: set "
                         f"train.engine=megatron and a train.dp x train.tp ({tc.dp} x {tc.tp}) it divides")
    if dense:
        raise ValueError(f"train.ep={tc.ep} splits a mixture of experts, but model.tiny.architecture="
                         f"{tiny.architecture} is dense: set it to qwen3_moe, or train.ep=1")
    if tiny is not None and tiny.num_experts % tc.ep:
        raise ValueError(f"train.ep={tc.ep} must divide the model's experts (model.tiny.num_experts="
                         f"{tiny.num_experts}); pick an ep that divides it")
