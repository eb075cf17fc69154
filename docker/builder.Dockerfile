# The TensorRT engine builder: NVIDIA's TensorRT image (NGC release pinned in docker/versions.env, the same
# TensorRT as the server image) with export/tensorrt_build.py, which needs only the standard library and
# tensorrt. Build from the repository root:
#
#   docker build -f docker/builder.Dockerfile -t bert-triton-engine-builder:0.1.0-ngc24.10 .
#
# Run it on a GPU of the serving type, with the repository mounted as the working directory (the build spec
# written by `make engines` names its files relative to the repository root):
#
#   docker run --rm --gpus all --user "$(id -u):$(id -g)" -v "$PWD:/workspace" \
#       bert-triton-engine-builder:0.1.0-ngc24.10 build/models/<name>/tensorrt_build.json
#
# In Kubernetes the chart runs docker/engine_cache.py from this image instead: it builds into a cache
# keyed by GPU product and assembles the model repository with the plan for the node's GPU.
#
# On a base without TensorRT (make image tries the local base) the build stops at its TensorRT check, saying so.
ARG TENSORRT_IMAGE=nvcr.io/nvidia/tensorrt:24.10-py3
FROM ${TENSORRT_IMAGE}

# FROM's argument again: one declared before FROM is FROM's alone (the label and messages below name it).
ARG TENSORRT_IMAGE
ARG TENSORRT_VERSION=10.5.0
ARG APP_UID=10001

LABEL org.opencontainers.image.title="bert-triton-engine-builder" \
      org.opencontainers.image.description="Builds TensorRT plans for bert-triton on the GPU it runs on" \
      org.opencontainers.image.base.name="${TENSORRT_IMAGE}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /opt/bert-triton
COPY export/__init__.py export/tensorrt_build.py export/
COPY docker/engine_cache.py docker/

# A plan only loads on the TensorRT it was built with: refuse an image whose TensorRT is not the pinned one.
RUN { python3 -c "import tensorrt" 2> /dev/null || { echo "${TENSORRT_IMAGE} has no TensorRT: the engine builder \
needs NVIDIA's TensorRT image (TENSORRT_IMAGE in docker/versions.env), with TensorRT ${TENSORRT_VERSION}" >&2; \
exit 1; }; } \
    && python3 -c "import sys, tensorrt; v = tensorrt.__version__; \
sys.exit(0 if v.split('.')[:3] == '${TENSORRT_VERSION}'.split('.') else f'TensorRT {v} != ${TENSORRT_VERSION}')" \
    && groupadd --system --gid "${APP_UID}" bert \
    && useradd --system --uid "${APP_UID}" --gid "${APP_UID}" --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin bert

ENV PYTHONPATH=/opt/bert-triton \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

WORKDIR /workspace
USER ${APP_UID}:${APP_UID}

# A one-shot build, not a service: nothing to health-check.
HEALTHCHECK NONE
ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", "python3", "-m", "export.tensorrt_build"]
