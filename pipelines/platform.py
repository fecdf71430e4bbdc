"""The names the pipeline and the Kubernetes manifests share: one place, so they cannot drift apart.

The components read their endpoints and credentials from environment variables; on Kubernetes those come
from the Secrets and Services that ``manifests/`` creates (a test checks every name below exists there).
"""

from __future__ import annotations

NAMESPACE = "dockflow"  # Kubernetes namespace of the RayCluster, MinIO and MLflow

# Secrets, and the env vars each one's keys become in every component's pod (key name == env var name).
MINIO_SECRET = "dockflow-minio"
MINIO_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
MLFLOW_SECRET = "dockflow-mlflow"
MLFLOW_SECRET_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
RAY_SECRET = "dockflow-ray"  # Ray token auth: every Ray node and every client presents this token
RAY_SECRET_ENV = ("RAY_AUTH_TOKEN",)
CLIENT_SECRETS = {MINIO_SECRET: MINIO_SECRET_ENV, MLFLOW_SECRET: MLFLOW_SECRET_ENV, RAY_SECRET: RAY_SECRET_ENV}

# Services and the endpoints the components use by default inside the cluster.
RAY_HEAD_SERVICE = "dockflow-head-svc"  # KubeRay names the head service "<RayCluster name>-head-svc"
RAY_CLUSTER_NAME = "dockflow"
MINIO_SERVICE = "minio"
MLFLOW_SERVICE = "mlflow"
RAY_ADDRESS = f"ray://{RAY_HEAD_SERVICE}.{NAMESPACE}.svc.cluster.local:10001"
S3_ENDPOINT = f"http://{MINIO_SERVICE}.{NAMESPACE}.svc.cluster.local:9000"
MLFLOW_URI = f"http://{MLFLOW_SERVICE}.{NAMESPACE}.svc.cluster.local:5000"

# Plain env vars the components read (besides the secrets): which process reads each is in docs/pipelines.md.
COMPONENT_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "MLFLOW_TRACKING_URI", "DOCKFLOW_S3_ENDPOINT",
                 "MLFLOW_S3_ENDPOINT_URL")
RAY_AUTH_MODE = "token"

# NetworkPolicies (manifests/base/network-policies.yaml): ingress is denied in the namespace but for what they
# admit. A pod reaches the Ray head's client port, MinIO or MLflow only with the matching label set to "true",
# from the namespace `dockflow` or the one KFP runs the tasks in; the Ray pods reach each other by RAY_NODE_LABEL.
RAY_CLIENT_LABEL = "dockflow.io/ray-client"
S3_CLIENT_LABEL = "dockflow.io/s3-client"
MLFLOW_CLIENT_LABEL = "dockflow.io/mlflow-client"
RAY_NODE_LABEL = "dockflow.io/ray-node"
TASK_POD_LABELS = {RAY_CLIENT_LABEL: "true", S3_CLIENT_LABEL: "true", MLFLOW_CLIENT_LABEL: "true"}
KFP_NAMESPACE = "kubeflow"  # where standalone KFP runs the task pods (manifests/kfp-namespace)

DEFAULT_IMAGE = "ghcr.io/dockflow/dockflow-cpu:0.1.0"  # built by the top-level Dockerfile
ACCELERATOR_RESOURCES = {"cpu": None, "nvidia": "nvidia.com/gpu", "ascend": "huawei.com/Ascend910"}
ENDPOINTS_CONFIG_MAP = "dockflow-endpoints"  # holds COMPONENT_ENV
