"""The RL post-training pipeline: setup, then per iteration generate -> infer -> update -> reshard
(-> evaluate when due), with teardown as the exit handler.

Iterations are unrolled at compile time, so the DAG shows every stage of every iteration, and the
staleness bound is a set of edges: generate(i) waits for reshard(i - 1 - max_staleness). With
``max_staleness: 0`` an iteration starts when the previous one ends (on-policy); with 1, generation of
iteration i may overlap inference and update of i - 1 (the dock holds both, each in its own window).

    from pipelines.rl_pipeline import PipelineOptions, build_pipeline
    pipeline = build_pipeline(PipelineOptions(iterations=2, max_staleness=0, eval_every=0))
    kfp.compiler.Compiler().compile(pipeline, "dockflow_rl.yaml")

No ``from __future__ import annotations`` here: KFP reads the pipeline's parameter types from real annotations.
"""


from dataclasses import dataclass, field

from kfp import dsl, kubernetes

from components import STAGE_COMPONENTS, setup, teardown
from pipelines import platform

PIPELINE_NAME = "dockflow-rl"


@dataclass(frozen=True)
class PipelineOptions:
    """What shapes the compiled DAG and its pods (runtime choices are pipeline parameters instead)."""

    iterations: int = field(metadata={"help": "RL iterations, unrolled into the DAG"})
    max_staleness: int = field(default=0, metadata={"help": "generate(i) waits for reshard(i-1-max_staleness)"})
    eval_every: int = field(default=0, metadata={"help": "evaluate every N iterations (0: before and after only)"})
    accelerator: str = field(default="cpu", metadata={"help": "cpu, nvidia or ascend: the stage tasks' device"})
    accelerator_count: int = field(default=1, metadata={"help": "accelerators per stage task (not cpu)"})
    cpu_request: str = field(default="1", metadata={"help": "CPU request of every task"})
    memory_request: str = field(default="4Gi", metadata={"help": "memory request of every task"})
    node_selector: dict[str, str] = field(default_factory=dict, metadata={"help": "node labels the tasks need"})
    retries: int = field(default=2, metadata={"help": "retries of the idempotent tasks (generate, evaluate, teardown)"})
    shm_size: str = field(default="2Gi", metadata={"help": "memory-backed /dev/shm of every task (Ray's object store)"})

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations must be at least 1, not {self.iterations}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, not {self.max_staleness}")
        if self.accelerator not in platform.ACCELERATOR_RESOURCES:
            raise ValueError(f"accelerator must be one of {sorted(platform.ACCELERATOR_RESOURCES)}, not {self.accelerator!r}")

    def eval_steps(self) -> list[int]:
        """Steps whose policy is evaluated: 0 (before RL), every ``eval_every``, and the last."""
        every = range(self.eval_every, self.iterations, self.eval_every) if self.eval_every > 0 else []
        return [0, *every, self.iterations]

    def compile_overrides(self) -> list[str]:
        """Config overrides that make the run agree with the DAG."""
        return [
            f"train.iterations={self.iterations}",
            f"train.max_staleness={self.max_staleness}",
            f"eval.every={self.eval_every}",
        ]


def _platform(task: dsl.PipelineTask, opts: PipelineOptions, image, compute: bool, retry: bool) -> dsl.PipelineTask:
    """Image, resources, credentials, scheduling and retries of one task (kfp.local ignores the Kubernetes part)."""
    task.set_container_image(image)
    task.set_caching_options(False)  # every task changes the run's state on the Ray cluster
    task.set_cpu_request(opts.cpu_request)
    task.set_memory_request(opts.memory_request)
    resource = platform.ACCELERATOR_RESOURCES[opts.accelerator]
    if compute and resource:
        task.set_accelerator_type(resource)
        task.set_accelerator_limit(opts.accelerator_count)
        kubernetes.add_toleration(task, key=resource, operator="Exists", effect="NoSchedule")
    if retry and opts.retries:
        task.set_retry(num_retries=opts.retries, backoff_duration="30s", backoff_factor=2.0)
    kubernetes.use_secret_as_env(task, platform.MINIO_SECRET, {k: k for k in platform.MINIO_SECRET_ENV})
    kubernetes.use_secret_as_env(task, platform.MLFLOW_SECRET, {k: k for k in platform.MLFLOW_SECRET_ENV})
    kubernetes.use_config_map_as_env(task, platform.ENDPOINTS_CONFIG_MAP, {k: k for k in platform.COMPONENT_ENV})
    for label, value in opts.node_selector.items():
        kubernetes.add_node_selector(task, label_key=label, label_value=value)
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=opts.shm_size)
    return task


def build_pipeline(opts: PipelineOptions):
    """The pipeline function for ``opts``: compile it, or call it under ``kfp.local``."""
    retried = {"generate", "evaluate"}  # the others are not idempotent: a rerun would train twice

    @dsl.pipeline(name=PIPELINE_NAME, description="DockFlow RL post-training over a Ray transfer dock.")
    def rl_pipeline(
        config: str = "configs/grpo_arith.yaml",
        overrides: list = [],  # noqa: B006 - KFP reads the default from the signature
        run_name: str = "",
        ray_address: str = "",
        mlflow_uri: str = "",
        s3_endpoint: str = "",
        s3_bucket: str = "",
        image: str = platform.DEFAULT_IMAGE,
    ):
        exit_task = teardown(
            config=config, overrides=overrides, run_name=run_name, ray_address=ray_address
        ).set_display_name("teardown")
        _platform(exit_task, opts, image, compute=False, retry=True)
        with dsl.ExitHandler(exit_task, name="rl-run"):
            start = setup(
                config=config, overrides=overrides, dag_overrides=opts.compile_overrides(), run_name=run_name,
                ray_address=ray_address, mlflow_uri=mlflow_uri, s3_endpoint=s3_endpoint, s3_bucket=s3_bucket,
            ).set_display_name("setup")
            _platform(start, opts, image, compute=False, retry=False)
            run = {"namespace": start.outputs["namespace"], "run_name": start.outputs["run_name"], "ray_address": ray_address}

            def stage(name: str, index: int, label: str) -> dsl.PipelineTask:
                arg = {"step": index} if name == "evaluate" else {"iteration": index}
                task = STAGE_COMPONENTS[name](**run, **arg).set_display_name(label)
                return _platform(task, opts, image, compute=True, retry=name in retried)

            evals = set(opts.eval_steps())
            last_eval = stage("evaluate", 0, "evaluate-0")
            reshards: list[dsl.PipelineTask] = []
            previous_generate = last_eval
            for i in range(opts.iterations):
                gen = stage("generate", i, f"generate-{i}").after(previous_generate)
                bound = i - 1 - opts.max_staleness
                if bound >= 0:
                    gen.after(reshards[bound])  # the staleness bound
                infer = stage("infer", i, f"infer-{i}").after(gen)
                update = stage("update", i, f"update-{i}").after(infer)
                if reshards:
                    update.after(reshards[-1])  # updates stay in order
                if last_eval is not None:
                    update.after(last_eval)  # the evaluation scores the policy before this update
                reshard = stage("reshard", i, f"reshard-{i}").after(update)
                reshards.append(reshard)
                previous_generate = gen
                last_eval = None
                if i + 1 in evals:
                    last_eval = stage("evaluate", i + 1, f"evaluate-{i + 1}").after(reshard)

    return rl_pipeline
