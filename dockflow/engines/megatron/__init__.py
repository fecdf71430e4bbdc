"""megatron-core as a training engine (issue 27, in progress; not wired into ``train.engine`` yet).

``convert``: Hugging Face <-> megatron weights (Qwen2/Qwen2.5, Qwen3, Llama); ``shard``: TP shards and PP stages of
them; ``cpu``: what megatron assumes of CUDA, answered on CPU, and MindSpeed's adaptor on NPU; ``model``: a rank's
``GPTModel``, its weights and its log-probs; ``schedule``: micro-batches through megatron's pipeline schedule
(log-probs, forward-backward) and the gradient reductions; ``checkpoint``: ``dist_checkpointing`` checkpoints of
the ranks' models and optimizers through the checkpoint store, loadable at another TP/PP; ``value``: PPO's critic
as a megatron value model (``MegatronCriticEngine``, not used by a run yet). ``convert`` and ``shard``
never import megatron; the others import it inside their functions.
"""
