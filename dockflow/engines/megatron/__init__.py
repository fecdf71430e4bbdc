"""megatron-core as a training engine (issue 27): ``train.engine: megatron`` runs the actor on train.dp replicas of a
train.tp x train.pp model (``MegatronTrainingEngine``) and PPO's critic on train.tp x train.pp ranks
(``MegatronCriticEngine``), each rank an actor (critic) worker, created by ``dockflow.engines.create_engines`` /
``create_critic_engine`` (docs/engines.md).

``convert``: Hugging Face <-> megatron weights (Qwen2/Qwen2.5, Qwen3, Llama); ``shard``: TP shards and PP stages of
them; ``cpu``: what megatron assumes of CUDA, answered on CPU, and MindSpeed's adaptor on NPU; ``model``: a rank's
``GPTModel``, its weights and its log-probs; ``schedule``: micro-batches through megatron's pipeline schedule
(log-probs, forward-backward) and the gradient reductions; ``checkpoint``: ``dist_checkpointing`` checkpoints of
the ranks' models and optimizers through the checkpoint store, loadable at another TP/PP; ``training``: the policy's
engine (the update, allgather-swap into the HF generation copy); ``persist``: its run checkpoints, HF directory and
layout-free state; ``value``: PPO's critic as a megatron value model. ``convert`` and ``shard`` never import
megatron; the others import it inside their functions.
"""
