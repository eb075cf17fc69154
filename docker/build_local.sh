#!/usr/bin/env bash
# make image: the server, Locust and engine-builder images on a base built here (docker/README.md, "Local base"),
# for machines that reach PyPI and Debian's mirrors but no registry. In order:
#
#   LOCAL_PYTHON_IMAGE  Debian (DEBIAN_RELEASE, minbase) from Debian's packages by mmdebstrap, its Python 3.11 in a
#                       venv at /opt/venv first on PATH, `docker import`ed; made once, kept while it exists
#   LOCAL_BASE_IMAGE    that plus the tritonserver of the nvidia-pytriton wheel (docker/base.Dockerfile)
#   the server image    docker/server.Dockerfile on LOCAL_BASE_IMAGE, onnxruntime at LOCAL_ONNXRUNTIME_VERSION
#   the Locust image    docker/locust.Dockerfile on LOCAL_PYTHON_IMAGE
#   the engine builder  docker/builder.Dockerfile on LOCAL_BASE_IMAGE, whose TensorRT check must refuse it (there is
#                       no TensorRT here): this fails if that build passes, or fails for another reason
#
# Names and pins: docker/versions.env. Builds use the host's network; the CA bundle that PIP_CERT (or pip's own
# global.cert) names reaches pip as a build secret, never a layer. Seconds per step and the images' sizes: build/images/build.txt.
# REBUILD=1 makes LOCAL_PYTHON_IMAGE anew too (the other steps are BuildKit's to cache).
set -euo pipefail
cd "$(dirname "$0")/.."
set -a
# shellcheck source=versions.env
. docker/versions.env
set +a
export DOCKER_BUILDKIT=1
OUT=build/images
REPORT=$OUT/build.txt
SERVER=bert-triton-server:$LOCAL_IMAGE_TAG
LOCUST=bert-triton-locust:$LOCAL_IMAGE_TAG
BUILDER=bert-triton-engine-builder:$LOCAL_IMAGE_TAG
REFUSAL="has no TensorRT: the engine builder needs NVIDIA's TensorRT image"

say() { printf 'build_local: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# The CA bundle pip trusts here: PIP_CERT, else pip's own configuration (global.cert), else none.
PIP_CERT=${PIP_CERT:-$(python3 -m pip config list 2> /dev/null | sed -n "s/^global\.cert='\(.*\)'$/\1/p" | head -n 1)}
SECRET=()
if [[ -n ${PIP_CERT:-} ]]; then
    [[ -f $PIP_CERT ]] || die "PIP_CERT names $PIP_CERT, which is not a file"
    SECRET=(--secret "id=pip_cert,src=$PIP_CERT")
fi
build() { "$DOCKER" build --network host --progress plain "${SECRET[@]}" "$@"; }

# timed NAME COMMAND...: runs it and writes its seconds to the report.
timed() {
    local name=$1 start
    shift
    start=$(date +%s%N)
    "$@"
    local ms=$((($(date +%s%N) - start) / 1000000))
    printf '%-22s %d.%d s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) | tee -a "$REPORT" >&2
}

python_image() {
    if [[ ${REBUILD:-0} != 1 ]] && "$DOCKER" image inspect "$LOCAL_PYTHON_IMAGE" > /dev/null 2>&1; then
        say "$LOCAL_PYTHON_IMAGE exists (REBUILD=1 makes it anew)"
        return
    fi
    command -v mmdebstrap > /dev/null || die "mmdebstrap is missing (docker/start_dockerd.sh installs it as root)"
    local tar=$OUT/debian-$DEBIAN_RELEASE.tar mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
    local security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
    # libpython3.11: the Python backend stub links it. passwd: useradd, for the images' users. No manuals.
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates,libpython3.11,passwd \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
        "$DEBIAN_RELEASE" "$tar" "deb $mirror $DEBIAN_RELEASE main" "deb $mirror $DEBIAN_RELEASE-updates main" \
        "deb $security $DEBIAN_RELEASE-security main"
    "$DOCKER" import --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' "$tar" "$LOCAL_PYTHON_IMAGE" > /dev/null
    rm -f "$tar"
}

base_image() {
    build -f docker/base.Dockerfile --build-arg "PYTHON_IMAGE=$LOCAL_PYTHON_IMAGE" \
        --build-arg "PYTRITON_VERSION=$PYTRITON_VERSION" -t "$LOCAL_BASE_IMAGE" .
}

# TENSORRT_VERSION empty: the base has no TensorRT to check.
server_image() {
    local pins=(NUMPY_VERSION TOKENIZERS_VERSION TRITONCLIENT_VERSION GRPCIO_VERSION TOMLI_VERSION AIOHTTP_VERSION
        ORJSON_VERSION OPENTELEMETRY_VERSION NVIDIA_ML_PY_VERSION) args=() pin
    for pin in "${pins[@]}"; do args+=(--build-arg "$pin=${!pin}"); done
    build -f docker/server.Dockerfile "${args[@]}" --build-arg "TRITONSERVER_IMAGE=$LOCAL_BASE_IMAGE" \
        --build-arg TENSORRT_VERSION= --build-arg "ONNXRUNTIME_VERSION=$LOCAL_ONNXRUNTIME_VERSION" \
        --build-arg WITH_TORCH=0 -t "$SERVER" .
}

locust_image() {
    local pins=(LOCUST_VERSION NUMPY_VERSION TOKENIZERS_VERSION TRITONCLIENT_VERSION AIOHTTP_VERSION) args=() pin
    for pin in "${pins[@]}"; do args+=(--build-arg "$pin=${!pin}"); done
    build -f docker/locust.Dockerfile "${args[@]}" --build-arg "LOCUST_IMAGE=$LOCAL_PYTHON_IMAGE" -t "$LOCUST" .
}

builder_refused() {
    local log=$OUT/builder.log
    if build -f docker/builder.Dockerfile --build-arg "TENSORRT_IMAGE=$LOCAL_BASE_IMAGE" \
        --build-arg "TENSORRT_VERSION=$TENSORRT_VERSION" -t "$BUILDER" . > "$log" 2>&1; then
        die "the engine builder was built on $LOCAL_BASE_IMAGE, which has no TensorRT: its check let it through"
    fi
    # What the step printed (#<step> <seconds> <line>), not the command BuildKit echoes.
    local said
    said=$(grep -E "^#[0-9]+ [0-9.]+ .*$REFUSAL" "$log" | head -n 1 | cut -d ' ' -f 3-)
    [[ -n $said ]] || { tail -n 30 "$log" >&2; die "the engine builder failed, but not at its TensorRT check"; }
    say "the engine builder refused, as it must here: $said"
}

mkdir -p "$OUT"
: > "$REPORT"
bash docker/start_dockerd.sh
# Debian's client, once start_dockerd.sh has installed it: its BuildKit is built in (a newer client needs buildx).
DOCKER=${DOCKER:-$([[ -x /usr/bin/docker ]] && echo /usr/bin/docker || echo docker)}
"$DOCKER" version --format 'docker client {{.Client.Version}}, server {{.Server.Version}}' | tee -a "$REPORT" >&2
timed "$LOCAL_PYTHON_IMAGE" python_image
timed "$LOCAL_BASE_IMAGE" base_image
timed "$SERVER" server_image
timed "$LOCUST" locust_image
timed "$BUILDER (refused)" builder_refused
for image in "$LOCAL_PYTHON_IMAGE" "$LOCAL_BASE_IMAGE" "$SERVER" "$LOCUST"; do
    "$DOCKER" image inspect --format "{{.Size}}" "$image" |
        awk -v name="$image" '{ printf "%-40s %.0f MB\n", name, $1 / 1e6 }' | tee -a "$REPORT" >&2
done
