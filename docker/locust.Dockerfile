# Locust (pinned in docker/versions.env, the same release as pyproject.toml) plus what the project's load
# test imports: loadtest/locustfile.py uses the project's client (tritonclient, numpy, aiohttp) and corpus
# (tokenizers). The project itself is not copied: docker/compose.yaml mounts the repository read-only at
# /mnt/project and puts it on PYTHONPATH. The build needs no context (docker/locust.Dockerfile.dockerignore).
# On a base without Locust (make image: the local Python base, docker/build_local.sh) LOCUST_VERSION is installed
# and the user `locust` made; on Locust's own image both are there already.
ARG LOCUST_IMAGE=locustio/locust:2.47.0
FROM ${LOCUST_IMAGE}

ARG LOCUST_VERSION=2.47.0
ARG NUMPY_VERSION=1.26.4
# DL3064 flags any ARG whose name contains "TOKEN"; this one is the version of the `tokenizers` package.
# hadolint ignore=DL3064
ARG TOKENIZERS_VERSION=0.23.3
ARG TRITONCLIENT_VERSION=2.73.0
ARG AIOHTTP_VERSION=3.14.5

LABEL org.opencontainers.image.title="bert-triton-locust" \
      org.opencontainers.image.description="Locust with the dependencies of bert-triton's load test"

USER 0
# The secret pip_cert: a CA bundle for an index reached through a machine's own CA.
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && python3 -m pip install --no-cache-dir \
        "locust==${LOCUST_VERSION}" \
        "numpy==${NUMPY_VERSION}" \
        "tokenizers==${TOKENIZERS_VERSION}" \
        "tritonclient[grpc,http]==${TRITONCLIENT_VERSION}" \
        "aiohttp==${AIOHTTP_VERSION}" \
    && if ! id locust > /dev/null 2>&1; then \
        useradd --system --user-group --home-dir /tmp --no-create-home --shell /usr/sbin/nologin locust; \
    fi
# The base image's unprivileged user (made above where the base has none); its uid is the base's to choose.
# hadolint ignore=DL3066
USER locust

# Locust's web UI answers on 8089; nothing else to check.
HEALTHCHECK NONE
ENTRYPOINT ["locust"]
