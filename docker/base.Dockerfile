# The local base (make image): Debian bookworm's Python 3.11, in a venv first on PATH (docker/build_local.sh makes
# that image from Debian's packages), plus the tritonserver 2.51.0 of the nvidia-pytriton wheel, which `make serve`
# runs, laid out where the server image expects NGC's:
#
#   /opt/tritonserver/bin/tritonserver
#   /opt/tritonserver/backends/python/   libtriton_python.so and the wheel's Python backend stub for this Python
#   /opt/tritonserver/caches/            the local response cache
#   /opt/tritonserver/lib/               the wheel's libraries (nvidia_pytriton.libs, on LD_LIBRARY_PATH)
#
# For machines that cannot pull nvcr.io: no TensorRT and no CUDA beyond the wheel's runtime, so CPU engines only.
# The server image is built on it with --build-arg TRITONSERVER_IMAGE=<this image> (docker/build_local.sh).
ARG PYTHON_IMAGE=bert-triton-python:bookworm
FROM ${PYTHON_IMAGE}

# FROM's argument again: one declared before FROM is FROM's alone (the label and messages below name it).
ARG PYTHON_IMAGE
ARG PYTRITON_VERSION=0.7.0

LABEL org.opencontainers.image.title="bert-triton-base" \
      org.opencontainers.image.description="Debian bookworm, Python 3.11 and the tritonserver of nvidia-pytriton" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The wheel only, unpacked (zipfile keeps no modes: the two executables get theirs back). The Python 3.13 stub's
# libpython is left out, as bench/make_kit.sh does. The build fails if a library cannot be resolved or tritonserver
# does not run. PIP_CERT: the CA bundle of a machine whose index is reached through its own CA (a build secret).
WORKDIR /tmp/wheel
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && python3 -m pip download --no-cache-dir --no-deps --only-binary=:all: "nvidia-pytriton==${PYTRITON_VERSION}" \
    && python3 -m zipfile -e nvidia_pytriton-*.whl unpacked \
    && python=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
    && stub="unpacked/pytriton/tritonserver/python_backend_stubs/${python}" \
    && mkdir -p /opt/tritonserver \
    && mv unpacked/pytriton/tritonserver/bin unpacked/pytriton/tritonserver/backends \
        unpacked/pytriton/tritonserver/caches /opt/tritonserver/ \
    && mv "${stub}/triton_python_backend_stub" /opt/tritonserver/backends/python/ \
    && mv unpacked/nvidia_pytriton.libs /opt/tritonserver/lib \
    && rm /opt/tritonserver/lib/libpython3* \
    && mv unpacked/nvidia_pytriton-*.dist-info /opt/tritonserver/ \
    && chmod 0755 /opt/tritonserver/bin/tritonserver /opt/tritonserver/backends/python/triton_python_backend_stub \
    && rm -rf /tmp/wheel \
    && ! LD_LIBRARY_PATH=/opt/tritonserver/lib ldd /opt/tritonserver/bin/tritonserver \
        /opt/tritonserver/backends/python/*.so /opt/tritonserver/backends/python/triton_python_backend_stub \
        /opt/tritonserver/caches/local/*.so | grep "not found" \
    && { LD_LIBRARY_PATH=/opt/tritonserver/lib /opt/tritonserver/bin/tritonserver --help 2>&1 || true; } \
        | grep -q -- --backend-directory
WORKDIR /

# The backend and the stub find the wheel's libraries here (their RPATHs name the wheel's own layout).
ENV LD_LIBRARY_PATH=/opt/tritonserver/lib
