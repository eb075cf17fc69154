# The serving image: NVIDIA's tritonserver (NGC release pinned in docker/versions.env) with the Python
# dependencies of the tokenizer and encoder stages and this project's launcher. Build from the repository
# root (docker/server.Dockerfile.dockerignore keeps the context to the files copied below), with BuildKit:
#
#   docker build -f docker/server.Dockerfile -t bert-triton-server:0.1.0-ngc24.10 .
#   docker build -f docker/server.Dockerfile --build-arg WITH_TORCH=1 -t bert-triton-server:0.1.0-ngc24.10-torch .
#
# WITH_TORCH=1 adds torch and safetensors for engine.kind = "torch" (several GiB); onnxruntime_cpu and
# tensorrt need neither. engine.kind "auto" on a CPU serves bf16 GEMMs on AMX / AVX-512 BF16 only in the image
# with torch, onnxruntime_cpu in the one without (common/engine_choice.py). The model repository is not in the image: mount it (compose, a PVC) at /models.
#
# The same file builds on the local base (make image: docker/build_local.sh), Debian's Python 3.11 and the
# nvidia-pytriton wheel's tritonserver in NGC's paths, with TRITONSERVER_IMAGE naming it and TENSORRT_VERSION empty
# (it has no TensorRT). No `# syntax=` line: BuildKit would pull its frontend from Docker Hub.
ARG TRITONSERVER_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3
FROM ${TRITONSERVER_IMAGE}

# FROM's argument again: one declared before FROM is FROM's alone (the label and messages below name it).
ARG TRITONSERVER_IMAGE
ARG TENSORRT_VERSION=10.5.0
ARG NUMPY_VERSION=1.26.4
# DL3064 flags any ARG whose name contains "TOKEN"; this one is the version of the `tokenizers` package.
# hadolint ignore=DL3064
ARG TOKENIZERS_VERSION=0.23.3
ARG ONNXRUNTIME_VERSION=1.23.2
ARG TRITONCLIENT_VERSION=2.73.0
ARG GRPCIO_VERSION=1.85.4
ARG TOMLI_VERSION=2.5.0
ARG AIOHTTP_VERSION=3.14.5
ARG ORJSON_VERSION=3.13.0
ARG OPENTELEMETRY_VERSION=1.45.2
ARG NVIDIA_ML_PY_VERSION=13.615.71
ARG WITH_TORCH=0
ARG TORCH_VERSION=2.13.0
ARG SAFETENSORS_VERSION=0.8.0
# torch from PyPI bundles its own CUDA runtime, which may need a newer driver than the NGC image does; an
# index such as https://download.pytorch.org/whl/cu126 gives a build for older drivers.
ARG TORCH_INDEX_URL=
ARG APP_UID=10001

LABEL org.opencontainers.image.title="bert-triton-server" \
      org.opencontainers.image.description="BERT-family text embeddings on NVIDIA Triton Inference Server" \
      org.opencontainers.image.base.name="${TRITONSERVER_IMAGE}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The plan check refuses TensorRT plans built for another TensorRT: this image must carry the pinned one. An empty
# TENSORRT_VERSION says the base has none (the local base), and the launcher then refuses every plan.
RUN [ -z "${TENSORRT_VERSION}" ] || compgen -G "/usr/lib/*-linux-gnu/libnvinfer.so.${TENSORRT_VERSION}*" > /dev/null \
    || { echo "${TRITONSERVER_IMAGE} does not ship TensorRT ${TENSORRT_VERSION} (docker/versions.env)" >&2; exit 1; }

# Into the python3 first on PATH (NGC's system one, the local base's venv): Triton's Python backend stub embeds it
# (the launcher puts it first on PATH and refuses numpy >= 2, which Triton 2.51's stub silently corrupts inputs with;
# the last step checks it). The secret pip_cert: a CA bundle for an index reached through a machine's own CA.
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && python3 -m pip install --no-cache-dir \
        "numpy==${NUMPY_VERSION}" \
        "tokenizers==${TOKENIZERS_VERSION}" \
        "onnxruntime==${ONNXRUNTIME_VERSION}" \
        "tritonclient[grpc]==${TRITONCLIENT_VERSION}" \
        "grpcio==${GRPCIO_VERSION}" \
        "aiohttp==${AIOHTTP_VERSION}" \
        "orjson==${ORJSON_VERSION}" \
        "opentelemetry-sdk==${OPENTELEMETRY_VERSION}" \
        "opentelemetry-exporter-otlp-proto-http==${OPENTELEMETRY_VERSION}" \
        "nvidia-ml-py==${NVIDIA_ML_PY_VERSION}" \
    && if [ "${WITH_TORCH}" = "1" ]; then \
        PIP_EXTRA_INDEX_URL="${TORCH_INDEX_URL}" python3 -m pip install --no-cache-dir \
            "torch==${TORCH_VERSION}" "safetensors==${SAFETENSORS_VERSION}" "numpy==${NUMPY_VERSION}"; \
    fi \
    && python3 -c "import numpy, sys; sys.exit(f'numpy {numpy.__version__} >= 2' if int(numpy.__version__.split('.')[0]) >= 2 else 0)"

WORKDIR /opt/bert-triton
COPY common/ common/
COPY settings/ settings/
COPY protocol/ protocol/
COPY serving/ serving/
COPY export/__init__.py export/tensorrt_build.py export/
COPY --chmod=0755 docker/healthcheck.py docker/tritonserver.sh docker/entrypoint.sh docker/
COPY docker/compat/tomllib.py /tmp/compat/

# tomllib (the settings reader) arrived in Python 3.11; on 3.10 tomli stands in under the same name.
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && if ! python3 -c "import tomllib" 2> /dev/null; then \
        python3 -m pip install --no-cache-dir "tomli==${TOMLI_VERSION}" \
        && cp /tmp/compat/tomllib.py "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"; \
    fi \
    && rm -rf /tmp/compat \
    && python3 -c "import serving.launcher" \
    && groupadd --system --gid "${APP_UID}" bert \
    && useradd --system --uid "${APP_UID}" --gid "${APP_UID}" --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin bert

# TRITONSERVER_BIN + TRITON_BACKENDS_DIR make the launcher use the image's tritonserver and backends
# (serving/launcher/triton_install.py prebuilt_triton). HOME=/tmp: caches (OpenAI Triton kernels for torch) go
# to a writable emptyDir when the root filesystem is read-only.
ENV PYTHONPATH=/opt/bert-triton \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TRITONSERVER_BIN=/opt/bert-triton/docker/tritonserver.sh \
    TRITONSERVER_REAL_BIN=/opt/tritonserver/bin/tritonserver \
    TRITON_BACKENDS_DIR=/opt/tritonserver/backends \
    TRITONSERVER_EXTRA_ARGS="--metrics-config=summary_latencies=true" \
    TRT_VERSION=${TRT_VERSION:-$TENSORRT_VERSION}

USER ${APP_UID}:${APP_UID}
EXPOSE 8000 8001 8002 8003 8080

# Loading models, warm-up and (torch) CUDA-graph capture take minutes: a long start period. Healthy only when every
# model answers an inference and the API front (api.port, 8080 by default) answers /v1 (docker/healthcheck.py).
HEALTHCHECK --start-period=600s --interval=30s --timeout=10s --retries=3 \
    CMD ["python3", "/opt/bert-triton/docker/healthcheck.py", "--api-url", "http://127.0.0.1:8080"]

# entrypoint.sh: NVIDIA's entrypoint where the base has it (CUDA forward compatibility on older data-center
# drivers), then the launcher.
ENTRYPOINT ["/opt/bert-triton/docker/entrypoint.sh", "python3", "-m", "serving.launcher"]
CMD ["--settings", "/opt/bert-triton/settings/defaults.toml", "--repository", "/models", "--host", "0.0.0.0"]
