# syntax=docker/dockerfile:1
# Locust (pinned in docker/versions.env, the same release as pyproject.toml) plus what the project's load
# test imports: loadtest/locustfile.py uses the project's client (tritonclient, numpy, aiohttp) and corpus
# (tokenizers). The project itself is not copied: docker/compose.yaml mounts the repository read-only at
# /mnt/project and puts it on PYTHONPATH. The build needs no context (docker/locust.Dockerfile.dockerignore).
ARG LOCUST_IMAGE=locustio/locust:2.47.0
FROM ${LOCUST_IMAGE}

ARG NUMPY_VERSION=1.26.4
# DL3064 flags any ARG whose name contains "TOKEN"; this one is the version of the `tokenizers` package.
# hadolint ignore=DL3064
ARG TOKENIZERS_VERSION=0.23.3
ARG TRITONCLIENT_VERSION=2.73.0
ARG AIOHTTP_VERSION=3.14.5

LABEL org.opencontainers.image.title="bert-triton-locust" \
      org.opencontainers.image.description="Locust with the dependencies of bert-triton's load test"

USER 0
RUN python3 -m pip install --no-cache-dir \
        "numpy==${NUMPY_VERSION}" \
        "tokenizers==${TOKENIZERS_VERSION}" \
        "tritonclient[grpc,http]==${TRITONCLIENT_VERSION}" \
        "aiohttp==${AIOHTTP_VERSION}"
# Back to the base image's own unprivileged user; its uid is the base image's to choose.
# hadolint ignore=DL3066
USER locust

# Locust's web UI answers on 8089; nothing else to check.
HEALTHCHECK NONE
ENTRYPOINT ["locust"]
