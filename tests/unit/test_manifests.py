"""The Kubernetes manifests and Dockerfiles agree with ``pipelines.platform`` (no cluster, no network: YAML only)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from pipelines import platform

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
BASE = MANIFESTS / "base"
OVERLAYS = MANIFESTS / "overlays"
# overlay directory -> key of platform.ACCELERATOR_RESOURCES
OVERLAY_ACCELERATOR = {"cpu": "cpu", "gpu": "nvidia", "npu": "ascend"}
ENDPOINT_VALUES = {
    "RAY_ADDRESS": platform.RAY_ADDRESS,
    "RAY_AUTH_MODE": platform.RAY_AUTH_MODE,
    "MLFLOW_TRACKING_URI": platform.MLFLOW_URI,
    "DOCKFLOW_S3_ENDPOINT": platform.S3_ENDPOINT,
    "MLFLOW_S3_ENDPOINT_URL": platform.S3_ENDPOINT,
}


def yaml_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def resources(root: Path) -> list[dict]:
    """Every Kubernetes object under ``root`` (kustomizations and patches left out)."""
    return [d for p in yaml_files(root) for d in load_docs(p) if isinstance(d, dict) and "kind" in d
            and d["kind"] != "Kustomization"]


def find(docs: list[dict], kind: str, name: str) -> dict:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind} {name!r} in manifests/base, found {len(hits)}"
    return hits[0]


def walk(node, key: str):
    """Every value stored under ``key`` anywhere in ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item, key)


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return resources(BASE)


def test_every_yaml_file_parses():
    files = yaml_files(MANIFESTS)
    assert files, "no YAML under manifests/"
    for path in files:
        assert load_docs(path), f"{path.relative_to(ROOT)} is empty"


def test_kustomization_paths_exist():
    kustomizations = sorted(MANIFESTS.rglob("kustomization.yaml"))
    assert {p.parent.relative_to(MANIFESTS).as_posix() for p in kustomizations} >= {
        "base", "base/shared", "kfp-namespace", "overlays/cpu", "overlays/gpu", "overlays/npu"}
    for path in kustomizations:
        (k,) = load_docs(path)
        assert k["kind"] == "Kustomization"
        refs = list(k.get("resources", [])) + [p["path"] for p in k.get("patches", []) if "path" in p]
        for ref in refs:
            target = path.parent / ref
            assert target.exists(), f"{path.relative_to(ROOT)} names {ref}, which does not exist"
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), f"{target} is not a kustomization"


def test_base_files_are_all_used():
    used = set()
    for path in BASE.rglob("kustomization.yaml"):
        used |= {(path.parent / r).resolve() for r in load_docs(path)[0].get("resources", [])}
    for path in yaml_files(BASE):
        assert path.name == "kustomization.yaml" or path.resolve() in used, f"{path} is in no kustomization"


def test_namespace(base):
    find(base, "Namespace", platform.NAMESPACE)
    assert load_docs(BASE / "kustomization.yaml")[0]["namespace"] == platform.NAMESPACE


def test_secrets_hold_exactly_the_component_env_keys_as_placeholders(base):
    assert set(platform.CLIENT_SECRETS) == {platform.MINIO_SECRET, platform.MLFLOW_SECRET, platform.RAY_SECRET}
    for name, keys in platform.CLIENT_SECRETS.items():
        secret = find(base, "Secret", name)
        data = secret.get("stringData", {})
        assert set(data) == set(keys), f"Secret {name} keys {sorted(data)} != {sorted(keys)}"
        # Only placeholders may be committed; docs/deployment.md says how to give the real values.
        assert all(str(v).startswith("change-me") for v in data.values()), f"Secret {name} holds a real value?"


def test_endpoints_configmap_matches_platform(base):
    cm = find(base, "ConfigMap", platform.ENDPOINTS_CONFIG_MAP)
    assert set(cm["data"]) == set(platform.COMPONENT_ENV)
    assert set(ENDPOINT_VALUES) == set(platform.COMPONENT_ENV)
    for key, value in ENDPOINT_VALUES.items():
        assert cm["data"][key] == value, key


def service_ports(svc: dict) -> set[int]:
    return {p["port"] for p in svc["spec"]["ports"]}


def test_services_match_the_endpoints(base):
    minio = find(base, "Service", platform.MINIO_SERVICE)
    mlflow = find(base, "Service", platform.MLFLOW_SERVICE)
    for svc, url in ((minio, platform.S3_ENDPOINT), (mlflow, platform.MLFLOW_URI)):
        parsed = urlparse(url)
        assert parsed.hostname == f"{svc['metadata']['name']}.{platform.NAMESPACE}.svc.cluster.local"
        assert parsed.port in service_ports(svc)
    assert 9001 in service_ports(minio)  # the console


def test_raycluster_head_service_and_client_port(base):
    cluster = find(base, "RayCluster", platform.RAY_CLUSTER_NAME)
    assert cluster["apiVersion"] == "ray.io/v1"
    # KubeRay names the head Service "<RayCluster name>-head-svc".
    assert f"{platform.RAY_CLUSTER_NAME}-head-svc" == platform.RAY_HEAD_SERVICE
    parsed = urlparse(platform.RAY_ADDRESS)
    assert parsed.scheme == "ray"
    assert parsed.hostname == f"{platform.RAY_HEAD_SERVICE}.{platform.NAMESPACE}.svc.cluster.local"
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert parsed.port in {p["containerPort"] for p in head["ports"]}


def test_raycluster_images_mounts_and_env(base):
    spec = find(base, "RayCluster", platform.RAY_CLUSTER_NAME)["spec"]
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    assert spec["workerGroupSpecs"], "no worker group"
    for pod in pods:
        container = pod["containers"][0]
        assert container["image"] == platform.DEFAULT_IMAGE
        shm = {v["name"] for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"}
        assert any(m["mountPath"] == "/dev/shm" and m["name"] in shm for m in container["volumeMounts"])
        secrets = {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
        assert secrets >= {platform.MINIO_SECRET, platform.MLFLOW_SECRET}
        names = {e["name"] for e in container.get("env", [])}
        assert "RAY_ADDRESS" not in names  # in-cluster Ray must not become a Ray client


def test_every_secret_and_configmap_reference_resolves(base):
    keys = {(d["kind"], d["metadata"]["name"]): set(d.get("data", {})) | set(d.get("stringData", {}))
            for d in base if d["kind"] in ("Secret", "ConfigMap")}
    refs = 0
    for kind, field in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
        for ref in walk(base, field):
            refs += 1
            assert (kind, ref["name"]) in keys, f"{field} to missing {kind} {ref['name']}"
            assert ref["key"] in keys[(kind, ref["name"])], f"{field} to missing key {ref['name']}/{ref['key']}"
    for kind, field in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
        for ref in walk(base, field):
            refs += 1
            assert (kind, ref["name"]) in keys, f"{field} to missing {kind} {ref['name']}"
    for volume in walk(base, "volumes"):
        for v in volume:
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in keys
            if "persistentVolumeClaim" in v:
                find(base, "PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])
    assert refs > 10


def test_minio_root_credentials_come_from_the_secret(base):
    env = {e["name"]: e for e in find(base, "Deployment", "minio")["spec"]["template"]["spec"]["containers"][0]["env"]}
    for var, key in (("MINIO_ROOT_USER", "AWS_ACCESS_KEY_ID"), ("MINIO_ROOT_PASSWORD", "AWS_SECRET_ACCESS_KEY")):
        assert env[var]["valueFrom"]["secretKeyRef"] == {"name": platform.MINIO_SECRET, "key": key}


def test_mlflow_server_stores_artifacts_in_minio(base):
    container = find(base, "Deployment", "mlflow")["spec"]["template"]["spec"]["containers"][0]
    assert "--artifacts-destination=s3://mlflow-artifacts" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_S3_ENDPOINT_URL"]["valueFrom"]["configMapKeyRef"]["name"] == platform.ENDPOINTS_CONFIG_MAP
    for key in platform.MINIO_SECRET_ENV:
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": platform.MINIO_SECRET, "key": key}


def decode_pointer(path: str) -> list[str]:
    return [seg.replace("~1", "/").replace("~0", "~") for seg in path.split("/")[1:]]


def overlay_patch_ops(overlay: Path) -> list[dict]:
    (k,) = load_docs(overlay / "kustomization.yaml")
    ops = []
    for patch in k.get("patches", []):
        assert patch["target"]["kind"] == "RayCluster" and patch["target"]["name"] == platform.RAY_CLUSTER_NAME
        ops += load_docs(overlay / patch["path"])[0]
    return ops


def limit_keys(ops: list[dict]) -> set[str]:
    """Resource names that the patch ops put under any container's resources.limits."""
    keys = set()
    for op in ops:
        segs = decode_pointer(op["path"])
        if len(segs) >= 2 and segs[-2] == "limits":
            keys.add(segs[-1])
        for limits in walk({segs[-1]: op.get("value")}, "limits"):
            keys |= set(limits or {})
    return keys


@pytest.mark.parametrize("overlay", sorted(OVERLAY_ACCELERATOR))
def test_overlay_requests_its_accelerator(overlay):
    path = OVERLAYS / overlay
    (k,) = load_docs(path / "kustomization.yaml")
    assert "../../base" in k["resources"]
    ops = overlay_patch_ops(path)
    wanted = platform.ACCELERATOR_RESOURCES[OVERLAY_ACCELERATOR[overlay]]
    accelerators = {r for r in platform.ACCELERATOR_RESOURCES.values() if r}
    found = limit_keys(ops) & accelerators
    assert found == ({wanted} if wanted else set()), f"overlay {overlay}: {found}"
    if wanted:
        values = {op["path"]: op.get("value") for op in ops}
        tolerations = values["/spec/workerGroupSpecs/0/template/spec/tolerations"]
        assert any(t["key"] == wanted for t in tolerations)
        assert "/spec/workerGroupSpecs/0/template/spec/nodeSelector" in values
        image = values["/spec/workerGroupSpecs/0/template/spec/containers/0/image"]
        assert image != platform.DEFAULT_IMAGE and {"nvidia": "cuda"}.get(OVERLAY_ACCELERATOR[overlay],
                                                                         OVERLAY_ACCELERATOR[overlay]) in image


def test_kfp_namespace_reuses_the_shared_objects():
    (k,) = load_docs(MANIFESTS / "kfp-namespace" / "kustomization.yaml")
    assert k["resources"] == ["../base/shared"]
    shared = resources(BASE / "shared")
    assert {(d["kind"], d["metadata"]["name"]) for d in shared} == {
        ("ConfigMap", platform.ENDPOINTS_CONFIG_MAP), *(("Secret", name) for name in platform.CLIENT_SECRETS)}


def torch_pin() -> str:
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("torch==")]
    assert len(pins) == 1
    return pins[0]


def test_cpu_dockerfile_installs_the_pinned_set():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.12-slim\b", text, re.M)
    assert platform.DEFAULT_IMAGE in text  # the build command names the image the pipeline uses
    assert "--index-url https://download.pytorch.org/whl/cpu " + torch_pin() in text
    assert "-c constraints.txt" in text
    assert re.search(r"^USER (?!root\b|0\b)\S+", text, re.M), "the CPU image must not run as root"
    for path in ("components/", "pipelines/", "configs/", "dockflow/", "constraints.txt", "pyproject.toml"):
        assert path in text, path


def test_accelerator_dockerfiles_exist():
    for kind, base_image in (("cuda", "vllm/vllm-openai"), ("ascend", "quay.io/ascend/vllm-ascend")):
        text = (ROOT / "images" / kind / "Dockerfile").read_text()
        assert re.search(rf"^FROM {re.escape(base_image)}:", text, re.M), kind
        assert "--override" in text and "-e ." in text, kind  # dockflow installed, the base image's torch kept
    assert "torch_npu" in (ROOT / "images" / "ascend" / "Dockerfile").read_text()
    assert "MindSpeed" in (ROOT / "images" / "ascend" / "Dockerfile").read_text()


def test_dockerignore_keeps_what_the_images_copy():
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", "runs", ".git"} <= ignored
    needed = {"components", "pipelines", "configs", "dockflow", "constraints.txt", "pyproject.toml", "README.md"}
    assert not ignored & needed
