"""What a run's base model is, for the Model Registry's lineage check.

    base_model_identity(cfg.model)   # "path /models/Qwen2.5-0.5B", or "tiny qwen2 hidden=128 layers=4 ..."

A run that starts from a registered version (``model.continue_from``) takes that version's own base model
(its ``dockflow.lineage.base_model`` tag), so a chain of recurring runs keeps one lineage; that is read from
the registry by the driver, not here.
"""

from __future__ import annotations

from dockflow.config.sections import ModelConfig


def base_model_identity(model: ModelConfig) -> str:
    """``model.path`` as given, or the tiny model's architecture and sizes (what its weights are drawn for)."""
    if model.path:
        return f"path {model.path}"
    t = model.tiny
    sizes = (
        f"hidden={t.hidden_size} layers={t.num_layers} heads={t.num_heads} kv_heads={t.num_kv_heads} "
        f"mlp={t.intermediate_size} positions={t.max_position_embeddings} merges={t.tokenizer_merges}"
    )
    if t.architecture == "qwen3_moe":
        sizes += (
            f" experts={t.num_experts} top_k={t.num_experts_per_tok} expert_mlp={t.moe_intermediate_size}"
        )
    return f"tiny {t.architecture} {sizes}"
