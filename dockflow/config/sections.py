"""The config's sections (one pydantic model each) but the algorithm's, which lives with each algorithm
(``dockflow.algos``: one module each); ``dockflow.config`` puts them together as ``Config``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from dockflow.config.base import Section
from dockflow.config.correction import RolloutCorrectionConfig


class RunConfig(Section):
    name: str = Field("dockflow", description="Run name: used for the run directory and the MLflow run.")
    output_dir: str = Field("runs", description="Parent directory of run directories.")
    seed: int = Field(0, description="Seed of every random choice in the run (data order, sampling, init).")


class RayConfig(Section):
    address: str | None = Field(None, description="Ray cluster to join ('auto', 'ray://host:10001'); null starts a local one.")
    num_cpus: int | None = Field(None, description="CPUs of the local cluster; null = all of this machine's.")
    namespace: str | None = Field(None, description="Ray namespace for the run's actors; null = derived from run.name.")
    actor_cpus: float = Field(2.0, ge=0.0, description="CPUs reserved by the actor (policy), shared by its "
                              "train.actor_ranks ranks (each asks Ray for actor_cpus / ranks; fractions are fine).")
    reference_cpus: float = Field(1.0, description="CPUs reserved by the reference worker (when one is used).")
    critic_cpus: float = Field(1.0, ge=0.0, description="CPUs reserved by the critic (PPO, PF-PPO), shared by its "
                               "train.critic_ranks ranks (each asks Ray for critic_cpus / ranks).")
    torch_threads: int = Field(2, description="torch intra-op threads per model worker; an actor or critic with several "
                               "ranks shares them as it shares its CPUs (torch_threads // ranks each, at least 1).")
    retain_host_memory: bool = Field(True, description="Model workers keep freed host memory for their next iteration "
                                     "(glibc: no mmap per large tensor, no trimming), so it needs no new pages; they hold "
                                     "their peak. Off glibc a worker warns once and keeps its defaults. false: the C "
                                     "library's defaults.")
    init_timeout_s: float = Field(120.0, gt=0.0, description="Seconds a worker may wait for Ray to place it (give it "
                                  "its CPUs and devices); a plan the cluster can never hold is refused at once.")
    engine_init_timeout_s: float = Field(600.0, gt=0.0, description="Seconds a placed worker may take to start (load its "
                                         "model, build its engines: vLLM on a loaded CPU takes minutes), from its placement.")
    head_timeout_s: float = Field(15.0, gt=0.0, description="With ray.address: seconds the Ray head may stay unreachable "
                                  "(on joining, and mid-run) before dockflow train stops with one line; raise it if the "
                                  "head restarts with GCS fault tolerance.")


class TinyModelConfig(Section):
    architecture: Literal["qwen2", "qwen3_moe"] = Field(
        "qwen2", description="transformers architecture of the tiny model: dense Qwen2, or Qwen3-MoE (experts below)."
    )
    hidden_size: int = Field(128, description="Hidden size of the tiny model.")
    num_layers: int = Field(4, description="Transformer layers.")
    num_heads: int = Field(4, description="Attention heads.")
    num_kv_heads: int = Field(2, description="Key/value heads (GQA).")
    intermediate_size: int = Field(512, description="MLP inner size.")
    max_position_embeddings: int = Field(128, description="Longest sequence the model handles.")
    tokenizer_merges: int = Field(
        64, ge=0, description="BPE merges the local tokenizer learns from the train prompts (0 = characters only)."
    )
    num_experts: int = Field(8, ge=1, description="qwen3_moe only: experts per MoE layer.")
    num_experts_per_tok: int = Field(2, ge=1, description="qwen3_moe only: experts each token is routed to (top-k).")
    moe_intermediate_size: int = Field(128, ge=1, description="qwen3_moe only: inner size of each expert's MLP.")


class LoraConfig(Section):
    """LoRA on the policy (PEFT's ``LoraConfig``): only the adapters train; the base model stays frozen and is the
    reference policy (the adapter switched off)."""

    rank: int = Field(8, ge=1, description="LoRA rank r of every adapter (PEFT's r): at most each target's smaller "
                      "dimension.")
    alpha: float = Field(16.0, gt=0.0, description="LoRA alpha (PEFT's lora_alpha): the adapter's output is scaled "
                         "by alpha / rank.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on each adapter's input while training "
                           "(PEFT's lora_dropout).")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="Linear layers that get an adapter, by name or dotted-name suffix (PEFT's target_modules); "
        "each must match at least one linear layer of the decoder (not lm_head).",
    )


class ModelConfig(Section):
    path: str | None = Field(
        None,
        description="HF model directory to start from: a local path, or s3://bucket/prefix (MinIO/S3, fetched by every "
        "worker into its own cache, bytes checked); null builds the tiny model below.",
    )
    continue_from: Literal["base", "latest", "champion"] = Field(
        "base",
        description="Where RL starts: 'base' = model.path or the tiny model (with the SFT warm start when sft.enabled); "
        "'latest' = the newest version of registry.model_name in the MLflow Model Registry; 'champion' = the version "
        "holding registry.champion_alias. A registered start takes its weights only (the reference model is that model "
        "too): optimizer state and data position start fresh, and SFT is skipped.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype.")
    lora: LoraConfig | None = Field(
        None,
        description="LoRA RL: train low-rank adapters on the frozen model (rank, alpha, dropout, target_modules; "
        "docs/engines.md); null = full fine-tuning.",
    )


class SFTConfig(Section):
    enabled: bool = Field(True, description="Warm-start the policy with SFT on the labeled subset first.")
    lr: float = Field(2e-3, ge=0.0, description="SFT peak learning rate (AdamW).")
    weight_decay: float = Field(
        1.0, ge=0.0,
        description="SFT AdamW weight decay. A tiny model trained from scratch on a few hundred labeled rows either "
        "finds the task's rule or memorises the rows, depending on its init and batch order; decay 1.0 makes it find "
        "the rule at every seed measured (docs/data_and_models.md, 'Over seeds'). 0: none.",
    )
    ema_decay: float = Field(
        0.995, ge=0.0, lt=1.0, description="Validate and keep the moving average of the weights (one more copy of "
        "the model during SFT), this decay per step, warmed up: min(decay, (1+t)/(10+t)). 0: the weights, no copy.",
    )
    warmup_steps: int = Field(100, ge=0, description="Optimizer steps of linear learning-rate warm-up.")
    batch_size: int = Field(64, ge=1, description="SFT batch size.")
    max_epochs: int = Field(200, ge=0, description="Upper bound on SFT epochs.")
    eval_every_epochs: int = Field(2, ge=1, description="Validate every this many epochs.")
    patience: int = Field(20, ge=1, description="Stop after this many validations without a new best accuracy.")
    target_val_accuracy: float | None = Field(
        None, gt=0.0, le=1.0, description="Stop at the first validation this accurate: a warm start of a known "
        "competence, whatever the seed (docs/data_and_models.md, 'Over seeds'). null: train to the plateau.",
    )
    min_val_accuracy: float | None = Field(
        None, ge=0.0, le=1.0,
        description="A warm start whose best validation accuracy stays below this stops the run at start, in one "
        "line: it has not learned the task, and RL would start from almost nothing. The demo configs set half of "
        "the task's recorded plateau. null: no floor.",
    )
    cache_dir: str = Field("runs/cache", description="SFT results are cached here, keyed by everything they depend on.")
    demonstrations: str | None = Field(
        None,
        description="With tools: module:function giving a labeled row's tool-use demonstration, fn(prompt=messages, "
        "answer=..., **columns) -> completion messages in TRL's format (assistant turns with tool_calls, tool "
        "messages, a final assistant turn); null: the rows' own 'completion' column.",
    )


class PartialRolloutConfig(Section):
    token_budget: int | None = Field(
        None,
        ge=1,
        description="Partial rollout: new tokens a response may get in one generation call; unfinished groups are "
        "parked (in the generator) and continued by the next iteration's generation with newer weights. null = off.",
    )
    max_age: int = Field(
        1, ge=0, description="Times a group may be parked; a group parked this often is finished without a budget."
    )
    over_provision: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Partial rollout: extra new prompts (a fraction of G, from the next iteration's) an iteration may "
        "start while its window is short, before finishing its own parked groups without a budget; what they "
        "park primes the next iteration (APRIL-style over-provisioning). 0 = none.",
    )
    on_stale: Literal["drop", "regenerate"] = Field(
        "drop",
        description="Partial rollout: a parked group whose oldest tokens would exceed the staleness bound "
        "(train.max_staleness + max_age) when trained is dropped (its prompt is lost), or regenerated (its prompt "
        "starts over with the current weights). Counted in flow/dropped_ or flow/regenerated_parked_groups_total.",
    )


class RolloutConfig(Section):
    prompts_per_iter: int = Field(32, ge=1, description="G: prompts per iteration.")
    group_size: int = Field(8, ge=1, description="N: responses per prompt.")
    max_new_tokens: int = Field(8, ge=1, description="Longest response in tokens.")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    batch_size: int = Field(256, ge=1, description="Sequences generated per forward batch.")
    partial: PartialRolloutConfig = Field(default_factory=PartialRolloutConfig)


class TrainConfig(Section):
    iterations: int = Field(600, ge=0, description="RL iterations.")
    lr: float = Field(2e-4, gt=0.0, description="Policy learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    epochs: int = Field(1, ge=1, description="Update epochs over each iteration's batch.")
    mini_batch_size: int = Field(256, ge=1, description="Samples per optimizer step.")
    micro_batch_size: int = Field(256, ge=1, description="Samples per forward/backward (gradient accumulation).")
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description="Micro-batches by tokens instead of samples: each forward/backward takes as many rows of the "
        "mini-batch (sorted by length with seqlen_balance) as keep rows x longest row (prompt + response tokens) "
        "within this budget, a longer row alone; the gradient is the same, memory follows the budget instead of "
        "the longest rows (verl's ppo_max_token_len_per_gpu). Every training engine. null = micro_batch_size rows.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass instead of keeping them: "
        "activation memory of one layer instead of all, for about one more forward. torch / FSDP2: Transformers' "
        "non-reentrant checkpointing, the micro-batch packed (it drops the KV cache the shared-prompt pass uses); "
        "megatron: full uniform recompute.",
    )
    grad_clip: float = Field(1.0, gt=0.0, description="Max global gradient norm.")
    infer_batch_size: int = Field(256, ge=1, description="Samples per forward in log-prob inference.")
    stage_timeout_s: float = Field(1800.0, gt=0.0, description="Seconds one stage may take before the run fails.")
    dp: int = Field(
        1,
        ge=1,
        description="Data-parallel ranks of the actor's update: 1 = one worker (plain torch); W >= 2 = W actor "
        "workers training with FSDP2 over torch.distributed (gloo on CPU), resharded to a full copy per rank for "
        "generation by allgather-swap (docs/reshard.md); with train.engine=megatron, W replicas of the tp x pp "
        "model, each taking its own share of every batch. train.mini_batch_size must divide by it.",
    )
    reshard_bucket_mb: float = Field(
        64.0, gt=0.0, description="dp >= 2: size of one allgather bucket when resharding for generation (MiB)."
    )
    engine: Literal["fsdp", "megatron"] = Field(
        "fsdp",
        description="The actor's training engine: fsdp = plain torch (dp 1) or FSDP2 (dp >= 2); megatron = "
        "megatron-core on train.dp replicas of train.tp x train.pp ranks (docs/engines.md), each an actor worker.",
    )
    tp: int = Field(1, ge=1, description="train.engine=megatron: tensor-parallel ranks of the policy (and of PPO's critic).")
    pp: int = Field(1, ge=1, description="train.engine=megatron: pipeline-parallel stages of the policy (and of PPO's critic).")
    ep: int = Field(1, ge=1, description="train.engine=megatron, a mixture-of-experts policy: expert-parallel ranks, each "
                    "holding experts/ep of every MoE layer; they are data-parallel ranks (ep divides train.dp x train.tp).")
    moe_aux_loss_coeff: float = Field(0.0, ge=0.0, description="train.engine=megatron, a mixture-of-experts policy: "
                                      "weight of megatron's load-balancing loss (aux_loss) in the update; 0 = none.")
    max_staleness: int = Field(
        0,
        ge=0,
        description="Policy versions generation may run ahead of the update (the dock then holds 1 + max_staleness "
        "iterations, each in its own window). 0 = on-policy. Generation of iteration i waits until the policy is at "
        "version >= i - max_staleness; needs placement.mode: disaggregated (one colocated actor cannot run ahead).",
    )
    old_log_prob: Literal["recompute", "rollout"] = Field(
        "recompute",
        description="Where the behaviour policy's log-probs (the ratio's denominator) come from: 'recompute' = a "
        "forward pass of the actor over every sample (the actor_infer stage); 'rollout' = the log-probs the "
        "generation engine computed while sampling, stored as old_log_prob (no extra pass; exact when generation "
        "and training run the same numerics, as the HF engine does).",
    )
    seqlen_balance: bool = Field(
        True,
        description="Balance the update by sequence length: with dp >= 2 the dock's controller splits each "
        "mini-batch into equal-count shares with near-equal response tokens (Karmarkar-Karp on metadata, before "
        "any data is read), and each mini-batch is sorted by length before it is cut into micro-batches, so a "
        "micro-batch pads only to lengths like its own. false = shares and micro-batches in index order.",
    )
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    router_replay: Literal["off", "replay"] = Field(
        "off",
        description="Mixture-of-experts policies: 'replay' = the trainer's forward passes (old log-probs, reference, "
        "update) use the experts the generating engine's router chose for each token (recorded as routed_experts) "
        "instead of their own top-k; the gate weights are still the trainer's (verl's R3). 'off' = the trainer routes "
        "itself. Either way moe/routing_mismatch is logged (docs/engines.md).",
    )

    @field_validator("router_replay", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        """YAML reads a bare ``off`` as false."""
        return "off" if value is False else value

    @property
    def actor_ranks(self) -> int:
        """Actor workers: dp x tp x pp (one process each)."""
        return self.dp * self.tp * self.pp

    @property
    def critic_ranks(self) -> int:
        """Critic workers (PPO's): tp x pp megatron ranks, else one torch process."""
        return self.tp * self.pp if self.engine == "megatron" else 1


class PlacementConfig(Section):
    mode: Literal["colocated", "disaggregated"] = Field(
        "colocated",
        description="colocated: the actor worker generates and trains (one process, stages take turns); "
        "disaggregated: generator workers hold their own copy of the policy and generate while the actor "
        "trains, up to train.max_staleness policy versions ahead (the asynchronous scheduler).",
    )
    generators: int = Field(1, ge=1, description="Generator workers in disaggregated mode; each takes a share of the prompts.")
    generator_cpus: float = Field(1.0, ge=0.0, description="CPUs each generator worker asks Ray for.")


class DockConfig(Section):
    backend: Literal["distributed", "centralized"] = Field("distributed", description="Transfer dock backend.")
    num_warehouses: int | None = Field(None, ge=1, description="Warehouses (shards of the global batch), dealt over the Ray nodes; a node's warehouses share its one dock process; null = one per Ray node.")
    get_timeout_s: float = Field(300.0, gt=0.0, description="Seconds a get waits for ready samples before failing.")


class EvalConfig(Section):
    every: int = Field(100, ge=0, description="Held-out accuracy every this many iterations (0 = only first and last).")
    num_prompts: int = Field(500, ge=1, description="Held-out prompts per evaluation.")
    batch_size: int = Field(500, ge=1, description="Prompts per greedy generation batch.")
    pass_k: int = Field(1, ge=1, description="Samples per prompt for pass@k and avg@k (1 = greedy accuracy only).")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of the pass@k samples.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold of the pass@k samples.")


class CheckpointConfig(Section):
    """Checkpoint store (``dockflow.storage``): where, how many, and how to reach S3/MinIO.

    S3 credentials are never config keys (configs are logged as MLflow params): they come from the environment
    (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, or ``MINIO_ROOT_USER``/``MINIO_ROOT_PASSWORD``) or from a
    mounted Kubernetes Secret directory named by ``DOCKFLOW_S3_SECRET_DIR`` (files ``access-key``, ``secret-key``).
    """

    every: int = Field(100, ge=0, description="Checkpoint every this many iterations (0 = only at the end).")
    dir: str | None = Field(
        None,
        description="Checkpoint root: a directory, or s3://bucket/prefix for S3/MinIO; each run's checkpoints go to "
        "<dir>/<run.name>. null = <run.output_dir>/<run.name>/checkpoints.",
    )
    keep: int = Field(2, ge=1, description="Keep the last K checkpoints.")
    keep_best: bool = Field(
        False, description="Also keep the best committed checkpoint by best_metric (besides the last K)."
    )
    best_metric: str | None = Field(
        None,
        description="Key of the commit meta that ranks checkpoints for keep_best (the trainer writes 'accuracy', "
        "the last held-out accuracy); checkpoints whose value is missing or not a number are not candidates.",
    )
    best_mode: Literal["max", "min"] = Field("max", description="Whether a higher (max) or lower (min) best_metric is better.")
    s3_endpoint: str | None = Field(
        None,
        description="S3 API endpoint for s3:// dirs: host:port or http(s)://host:port; null = env DOCKFLOW_S3_ENDPOINT, "
        "then AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS (s3.amazonaws.com).",
    )
    s3_secure: bool | None = Field(
        None, description="TLS to the S3 endpoint; null = from the endpoint's scheme (http:// off, https:// or none: on)."
    )
    s3_region: str | None = Field(
        None, description="S3 region; null = env AWS_REGION or AWS_DEFAULT_REGION, else asked from the server."
    )
    s3_create_bucket: bool = Field(False, description="Create the bucket of an s3:// dir if it does not exist.")
    s3_attempts: int = Field(
        4, ge=1, description="Tries per S3 request on transient errors (connection, timeout, HTTP 5xx/429), with backoff."
    )
    s3_backoff_s: float = Field(0.5, ge=0, description="Wait before the 2nd try of an S3 request; doubled per try (max 30 s).")
    s3_connect_timeout_s: float = Field(5.0, gt=0, description="Seconds to wait for a connection to the S3 endpoint.")
    s3_read_timeout_s: float = Field(60.0, gt=0, description="Seconds an S3 socket read may wait for data.")

    @model_validator(mode="after")
    def _check_best(self) -> CheckpointConfig:
        if self.keep_best and not self.best_metric:
            raise ValueError(
                "checkpoint.keep_best is true but checkpoint.best_metric is not set: "
                "name a key of the commit meta (e.g. accuracy)"
            )
        return self


class FaultToleranceConfig(Section):
    restart: bool = Field(
        False, description="When a worker dies, restart the workers from the last checkpoint instead of failing."
    )
    max_restarts: int = Field(
        2, ge=0, description="Restarts allowed per run before the failure is final (pipeline task retries count too)."
    )
    attach_grace_s: float = Field(
        300.0,
        gt=0.0,
        description="Pipeline runs: seconds the run's stage loops keep going on the Ray cluster while no pipeline task "
        "is attached to them; then they stop and the run's actors are killed (a run that KFP terminated).",
    )


class RegistryConfig(Section):
    """MLflow Model Registry: where each run registers its final model, and the champion alias recurring runs move."""

    model_name: str | None = Field(
        None, description="Registered model that a finished run adds its final model to as a new version; null = none."
    )
    champion_alias: str = Field("champion", description="Alias of the best version so far (model.continue_from: champion).")
    champion_margin: float = Field(
        0.0,
        description="A new version takes the champion alias only when its held-out score beats the champion's by more "
        "than this (in the score's units).",
    )
    score_metric: str = Field(
        "eval/test_accuracy",
        description="Held-out metric of the final evaluation that ranks versions (higher is better); the task's own "
        "verifier scores it.",
    )
    lock_timeout_s: float = Field(
        120.0, gt=0.0, description="Seconds to wait for another run's champion decision before failing."
    )


class TrackingConfig(Section):
    uri: str | None = Field(
        None,
        description="MLflow tracking URI; null = the local store <run.output_dir>/mlflow.db, which every run under that "
        "directory shares (one experiment, one Model Registry).",
    )
    experiment: str = Field("dockflow", description="MLflow experiment name.")
    system_metrics: bool = Field(False, description="Log CPU, memory, disk, network (and GPU) usage as system/... metrics.")
    system_metrics_interval_s: float = Field(10.0, gt=0.0, description="Seconds between system metric samples.")
    flush_every_s: float = Field(
        5.0, ge=0.0,
        description="The training loop's metrics go to MLflow in one batch per this many seconds (and at every "
        "checkpoint and the run's end); 0 = a write per iteration, which on a small machine costs the model "
        "worker CPU it needs.",
    )
