"""The RL post-training pipeline: a DAG of constant size whose stage tasks stream over every iteration.

    setup -> generate, infer, update, reshard, evaluate (side by side) -> finish;  teardown (exit handler)

``setup`` starts the run's stage loops on the Ray cluster (``dockflow.flow.supervisor``); each stage task
attaches to its loop and follows it through every iteration, so the DAG is the same for 10 and 100,000
iterations: ``iterations``, ``max_staleness``, ``eval_every``, ``checkpoint_every`` and ``continue_from`` are
run-time parameters (the Create-run form), and the staleness bound is enforced by policy versions on the
cluster, not by edges. Under ``kfp.local`` the tasks run one at a time; on a cluster all stage tasks run at
once. Either way the loops run on the cluster and any one attached task keeps them alive.

    from pipelines.rl_pipeline import PipelineOptions, build_pipeline
    kfp.compiler.Compiler().compile(build_pipeline(PipelineOptions()), "dockflow_rl.yaml")

No ``from __future__ import annotations`` here: KFP reads the pipeline's parameter types from real annotations.
"""


from dataclasses import dataclass, field

from kfp import dsl, kubernetes

from components import STAGE_COMPONENTS, finish, setup, teardown
from pipelines import platform

PIPELINE_NAME = "dockflow-rl"
PIPELINE_CHECKPOINT_EVERY = 10  # default cadence of pipeline runs: a restart redoes at most 9 iterations


@dataclass(frozen=True)
class PipelineOptions:
    """What the compiled pipeline's pods get, and the defaults its Create-run form shows."""

    config: str = field(default="configs/grpo_arith.yaml", metadata={"help": "config path in the image"})
    iterations: int = field(default=600, metadata={"help": "default of the iterations parameter"})
    max_staleness: int = field(default=0, metadata={"help": "default of the max_staleness parameter"})
    eval_every: int = field(default=100, metadata={"help": "default of the eval_every parameter"})
    checkpoint_every: int = field(default=PIPELINE_CHECKPOINT_EVERY, metadata={"help": "default checkpoint cadence"})
    cpu_request: str = field(default="250m", metadata={"help": "CPU request of every task (they only supervise)"})
    memory_request: str = field(default="1Gi", metadata={"help": "memory request of every task"})
    setup_cpu_request: str = field(default="2", metadata={"help": "CPU request of setup (the SFT warm start)"})
    setup_memory_request: str = field(default="8Gi", metadata={"help": "memory request of setup"})
    node_selector: dict[str, str] = field(default_factory=dict, metadata={"help": "node labels the tasks need"})
    retries: int = field(default=2, metadata={"help": "retries of every task but setup (a retry re-attaches)"})
    retry_backoff_s: int = field(default=10, metadata={"help": "first wait before a retry (doubles)"})

    def __post_init__(self) -> None:
        for name in ("iterations", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_staleness < 0 or self.eval_every < 0:
            raise ValueError("max_staleness and eval_every must be >= 0")
        if self.retries < 0 or self.retry_backoff_s < 0:
            raise ValueError("retries and retry_backoff_s must be >= 0")


def _platform(task: dsl.PipelineTask, opts: PipelineOptions, image, retry: bool) -> dsl.PipelineTask:
    """Image, resources, credentials, the labels the NetworkPolicies admit, scheduling and retries of one task
    (kfp.local ignores the Kubernetes part).
    No task asks for an accelerator: the models run on the Ray cluster, which owns the devices."""
    task.set_container_image(image)
    task.set_caching_options(False)  # every task acts on the run's live state on the Ray cluster
    task.set_cpu_request(opts.cpu_request)
    task.set_memory_request(opts.memory_request)
    if retry and opts.retries:
        task.set_retry(num_retries=opts.retries, backoff_duration=f"{opts.retry_backoff_s}s", backoff_factor=2.0)
    for secret, keys in platform.CLIENT_SECRETS.items():  # S3 and MLflow credentials, the Ray token
        kubernetes.use_secret_as_env(task, secret, {k: k for k in keys})
    kubernetes.use_config_map_as_env(task, platform.ENDPOINTS_CONFIG_MAP, {k: k for k in platform.COMPONENT_ENV})
    for label, value in platform.TASK_POD_LABELS.items():  # what the NetworkPolicies admit to Ray, MinIO, MLflow
        kubernetes.add_pod_label(task, label_key=label, label_value=value)
    for label, value in opts.node_selector.items():
        kubernetes.add_node_selector(task, label_key=label, label_value=value)
    return task


def build_pipeline(opts: PipelineOptions):
    """The pipeline function for ``opts``: compile it, or call it under ``kfp.local``."""

    # The run-time parameters of the Create-run form. They stay positional: KFP calls a pipeline function with
    # them positionally (kfp/dsl/pipeline_context.py, graph_component.py: pipeline_func(*args_list)).
    @dsl.pipeline(name=PIPELINE_NAME, description="DockFlow RL post-training over a Ray transfer dock.")
    def rl_pipeline(
        config: str = opts.config,
        overrides: list = [],  # noqa: B006 - KFP reads the default from the signature
        run_name: str = "",
        iterations: int = opts.iterations,
        max_staleness: int = opts.max_staleness,
        eval_every: int = opts.eval_every,
        checkpoint_every: int = opts.checkpoint_every,
        continue_from: str = "base",
        ray_address: str = "",
        mlflow_uri: str = "",
        s3_endpoint: str = "",
        s3_bucket: str = "",
        image: str = platform.DEFAULT_IMAGE,
    ):
        job_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER  # names the run when run_name is empty
        exit_task = teardown(config=config, overrides=overrides, run_name=run_name, job_id=job_id,
                             ray_address=ray_address).set_display_name("teardown")
        _platform(exit_task, opts, image, retry=True)
        with dsl.ExitHandler(exit_task, name="rl-run"):
            start = setup(
                config=config, overrides=overrides, run_name=run_name, job_id=job_id, iterations=iterations,
                max_staleness=max_staleness, eval_every=eval_every, checkpoint_every=checkpoint_every,
                continue_from=continue_from, ray_address=ray_address, mlflow_uri=mlflow_uri, s3_endpoint=s3_endpoint,
                s3_bucket=s3_bucket,
            ).set_display_name("setup")
            _platform(start, opts, image, retry=False)  # a second setup would end the first attempt's run
            start.set_cpu_request(opts.setup_cpu_request).set_memory_request(opts.setup_memory_request)
            run = {"namespace": start.outputs["namespace"], "run_name": start.outputs["run_name"],
                   "ray_address": ray_address}
            stages = [_platform(comp(**run).set_display_name(name), opts, image, retry=True)
                      for name, comp in STAGE_COMPONENTS.items()]
            done = finish(**run).set_display_name("finish").after(*stages)
            _platform(done, opts, image, retry=True)

    return rl_pipeline
