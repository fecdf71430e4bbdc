"""Ray token auth and the NetworkPolicies in the rendered manifests (``kubectl kustomize`` of each overlay and of
``manifests/kfp-namespace``): every Ray container has the token from the Secret; each of the Ray head, MinIO and
MLflow is selected by a policy that admits only labelled clients, under a default deny; the pods that must reach
them (the Ray pods, MLflow, the bucket Job, the KFP task pods of the compiled pipeline) carry those labels, and
pods without them, or in another namespace, are refused. The policies are evaluated here as the NetworkPolicy
API defines them (matchLabels, namespaceSelector + podSelector, ports); no cluster, no CNI."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pipelines import platform

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: `kubectl kustomize` renders "
                                "the manifests these tests read (install kubectl to run them)")
OVERLAYS = ("cpu", "gpu", "npu")
RAY_PORTS = {"gcs": 6379, "dashboard": 8265, "client": 10001}


@dataclass(frozen=True)
class Pod:
    """A pod as the policies see it: where it runs and its labels; ``ports``: the container ports it serves."""

    name: str
    namespace: str
    labels: dict
    ports: frozenset = frozenset()
    spec: dict | None = None


def render(path: Path) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module", params=OVERLAYS)
def docs(request) -> list[dict]:
    return render(ROOT / "manifests" / "overlays" / request.param)


def pods(docs: list[dict]) -> dict[str, Pod]:
    """Every pod template of the render, by name (``<RayCluster>-head``, ``<RayCluster>-<group>``)."""
    out = {}
    for d in docs:
        templates = {}
        if d["kind"] in ("Deployment", "Job"):
            templates[d["metadata"]["name"]] = d["spec"]["template"]
        elif d["kind"] == "RayCluster":
            templates[f"{d['metadata']['name']}-head"] = d["spec"]["headGroupSpec"]["template"]
            for group in d["spec"]["workerGroupSpecs"]:
                templates[f"{d['metadata']['name']}-{group['groupName']}"] = group["template"]
        for name, t in templates.items():
            ports = frozenset(p["containerPort"] for c in t["spec"]["containers"] for p in c.get("ports", []))
            out[name] = Pod(name, d["metadata"]["namespace"], t.get("metadata", {}).get("labels", {}), ports, t["spec"])
    return out


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Pod:
    """A KFP task pod of the compiled pipeline: the labels kfp-kubernetes gives it, in KFP's namespace."""
    from pipelines.launch import compile_pipeline
    from pipelines.rl_pipeline import PipelineOptions

    out = tmp_path_factory.mktemp("pipeline") / "p.yaml"
    _, platform_spec = yaml.safe_load_all(compile_pipeline(PipelineOptions(), out).read_text())
    executors = platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values()
    labels = [e["podMetadata"]["labels"] for e in executors]
    assert labels and all(x == labels[0] for x in labels), labels
    return Pod("kfp-task", platform.KFP_NAMESPACE, labels[0])


def selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, f"only matchLabels is evaluated here: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def peer_admits(peer: dict, policy_ns: str, source: Pod) -> bool:
    assert set(peer) <= {"podSelector", "namespaceSelector"}, f"unexpected peer {peer}"
    ns_labels = {"kubernetes.io/metadata.name": source.namespace}  # set by Kubernetes on every namespace
    in_ns = selects(peer["namespaceSelector"], ns_labels) if "namespaceSelector" in peer else source.namespace == policy_ns
    return in_ns and selects(peer.get("podSelector", {}), source.labels)


def policies(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


def selecting(docs: list[dict], target: Pod) -> list[dict]:
    return [p for p in policies(docs) if p["metadata"]["namespace"] == target.namespace
            and "Ingress" in p["spec"].get("policyTypes", []) and selects(p["spec"]["podSelector"], target.labels)]


def admits(docs: list[dict], source: Pod, target: Pod, port: int) -> bool:
    """Whether ingress from ``source`` to ``target`` on TCP ``port`` is allowed (a pod no policy selects admits
    everything; a selected one what the union of its policies' rules admits)."""
    chosen = selecting(docs, target)
    if not chosen:
        return True
    for policy in chosen:
        for rule in policy["spec"].get("ingress", []):
            peers_ok = "from" not in rule or any(peer_admits(p, target.namespace, source) for p in rule["from"])
            ports_ok = "ports" not in rule or any(p.get("port") == port and p.get("protocol", "TCP") == "TCP"
                                                  for p in rule["ports"])
            if peers_ok and ports_ok:
                return True
    return False


def ray_containers(docs: list[dict]) -> list[dict]:
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_every_ray_container_runs_token_auth_with_the_secrets_token(docs):
    containers = ray_containers(docs)
    assert len(containers) >= 2
    for c in containers:
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["RAY_AUTH_MODE"].get("value") == "token", c["name"]
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": platform.RAY_SECRET,
                                                                      "key": "RAY_AUTH_TOKEN"}, c["name"]
        assert "value" not in env["RAY_AUTH_TOKEN"]  # never inline
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == platform.RAY_SECRET)
    assert set(secret["stringData"]) == {"RAY_AUTH_TOKEN"} and secret["stringData"]["RAY_AUTH_TOKEN"].startswith("change-me")


def test_the_task_pods_namespace_gets_the_token_and_token_mode():
    docs = render(ROOT / "manifests" / "kfp-namespace")
    assert {d["metadata"]["namespace"] for d in docs} == {platform.KFP_NAMESPACE}
    assert any(d["kind"] == "Secret" and d["metadata"]["name"] == platform.RAY_SECRET for d in docs)
    endpoints = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == platform.ENDPOINTS_CONFIG_MAP)
    assert endpoints["data"]["RAY_AUTH_MODE"] == "token"


def test_ingress_is_denied_by_default(docs):
    deny = [p for p in policies(docs) if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")]
    assert len(deny) == 1 and deny[0]["spec"]["policyTypes"] == ["Ingress"]
    assert deny[0]["metadata"]["namespace"] == platform.NAMESPACE


@pytest.mark.parametrize(("pod", "client_label", "port"), [
    (f"{platform.RAY_CLUSTER_NAME}-head", platform.RAY_CLIENT_LABEL, RAY_PORTS["client"]),
    ("minio", platform.S3_CLIENT_LABEL, 9000),
    ("mlflow", platform.MLFLOW_CLIENT_LABEL, 5000),
])
def test_each_service_admits_only_labelled_clients_on_its_port(docs, pod, client_label, port):
    target = pods(docs)[pod]
    assert port in target.ports
    chosen = [p for p in selecting(docs, target) if p["spec"]["podSelector"]]
    assert chosen, f"no NetworkPolicy selects {pod}"
    for policy in chosen:
        for rule in policy["spec"]["ingress"]:
            assert rule.get("from"), f"{policy['metadata']['name']}: a rule without `from` admits everyone"
            for peer in rule["from"]:
                wanted = peer.get("podSelector", {}).get("matchLabels", {})
                assert wanted in ({client_label: "true"}, {platform.RAY_NODE_LABEL: "true"}), peer
                if "namespaceSelector" in peer:
                    assert peer["namespaceSelector"] == {
                        "matchLabels": {"kubernetes.io/metadata.name": platform.KFP_NAMESPACE}}, peer
    client = Pod("client", platform.NAMESPACE, {client_label: "true"})
    assert admits(docs, client, target, port)
    assert not admits(docs, Pod("unlabelled", platform.NAMESPACE, {}), target, port)
    assert not admits(docs, Pod("elsewhere", "other", {client_label: "true"}), target, port)


def test_the_ray_dashboard_and_gcs_are_not_open_to_clients(docs, task):
    everything = pods(docs)
    head = everything[f"{platform.RAY_CLUSTER_NAME}-head"]
    head_args = next(d for d in docs if d["kind"] == "RayCluster")["spec"]["headGroupSpec"]["rayStartParams"]
    assert set(RAY_PORTS.values()) <= head.ports
    outsiders = [task, Pod("ray-client", platform.NAMESPACE, platform.TASK_POD_LABELS),
                 Pod("unlabelled", platform.NAMESPACE, {}), Pod("other-namespace", "other", {})]
    for port in (RAY_PORTS["dashboard"], RAY_PORTS["gcs"]):
        for source in outsiders:
            assert not admits(docs, source, head, port), f"{source.name} reaches the head's port {port}"
    if head_args.get("dashboard-host") not in ("127.0.0.1", "localhost"):
        assert [p for p in selecting(docs, head) if p["spec"]["podSelector"]], "dashboard on the pod IP, unfenced"
    assert admits(docs, task, head, RAY_PORTS["client"])


def test_the_pods_that_must_reach_each_service_can(docs, task):
    everything = pods(docs)
    head, minio, mlflow = (everything[n] for n in (f"{platform.RAY_CLUSTER_NAME}-head", "minio", "mlflow"))
    workers = [p for n, p in everything.items() if n.startswith(platform.RAY_CLUSTER_NAME) and p is not head]
    assert workers
    assert task.labels == platform.TASK_POD_LABELS
    must = [(task, head, RAY_PORTS["client"]), (task, minio, 9000), (task, mlflow, 5000),
            (mlflow, minio, 9000), (everything["minio-buckets"], minio, 9000)]
    for worker in workers:
        must += [(worker, head, port) for port in (*RAY_PORTS.values(), 40123)]  # 40123: a Ray worker port
        must += [(head, worker, 40123), (worker, minio, 9000), (worker, mlflow, 5000)]
    must += [(head, minio, 9000), (head, mlflow, 5000)]
    for source, target, port in must:
        assert admits(docs, source, target, port), f"{source.name} cannot reach {target.name}:{port}"
    for source in (task, mlflow, everything["minio-buckets"]):
        assert not admits(docs, source, workers[0], 40123), f"{source.name} reaches a Ray worker"
    assert not admits(docs, task, minio, 9001)  # the console: port-forward only


def test_the_policies_name_the_namespace_kfp_runs_in():
    (kfp,) = [d for d in yaml.safe_load_all((ROOT / "manifests" / "kfp-namespace" / "kustomization.yaml").read_text())]
    assert kfp["namespace"] == platform.KFP_NAMESPACE
