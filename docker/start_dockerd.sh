#!/usr/bin/env bash
# A Docker daemon for `make image` and `make image-test`, started here if none answers; idempotent.
#
# As root, Debian's docker.io (Docker 20.10: dockerd, a client with BuildKit built in, containerd, runc),
# mmdebstrap (the local base: docker/build_local.sh) and docker-compose 1.29 are installed with apt where missing.
# dockerd runs with no bridge, no iptables and no IP forwarding: every container and every build uses the host's
# network (--network host), so nothing goes to a bridge or another private address. Where no daemon can be had
# this says why and exits 1: the image targets fail, never skip.
set -euo pipefail

LOG_DIR=${DOCKERD_LOG_DIR:-/tmp/bert-triton-dockerd}
PACKAGES=(docker.io mmdebstrap docker-compose)

say() { printf 'start_dockerd: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

if [[ $(id -u) == 0 ]] && command -v apt-get > /dev/null; then
    missing=()
    for pair in dockerd:docker.io mmdebstrap:mmdebstrap docker-compose:docker-compose; do
        command -v "${pair%%:*}" > /dev/null || missing+=("${pair#*:}")
    done
    if ((${#missing[@]})); then
        say "installing ${missing[*]} from Debian"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
    fi
fi
# Debian's client where there is one: its BuildKit is built in, where a newer client needs the buildx plugin.
DOCKER=${DOCKER:-$([[ -x /usr/bin/docker ]] && echo /usr/bin/docker || echo docker)}
command -v "$DOCKER" > /dev/null || die "no docker client: as root with apt, this installs ${PACKAGES[*]}"

if "$DOCKER" info > /dev/null 2>&1; then
    exit 0
fi
[[ $(id -u) == 0 ]] || die "no Docker daemon answers at ${DOCKER_HOST:-/var/run/docker.sock}, and starting" \
    "dockerd needs root"
command -v dockerd > /dev/null || die "no Docker daemon answers and there is no dockerd to start (no apt-get?)"
mkdir -p "$LOG_DIR"
say "starting dockerd (no bridge, no iptables; log: $LOG_DIR/dockerd.log)"
# setsid: the daemon outlives this script and the make that ran it.
setsid dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
    > "$LOG_DIR/dockerd.log" 2>&1 < /dev/null &
pid=$!
for _ in $(seq 60); do
    if "$DOCKER" info > /dev/null 2>&1; then
        say "dockerd $("$DOCKER" version --format '{{.Server.Version}}') answers (pid $pid," \
            "storage driver $("$DOCKER" info --format '{{.Driver}}'))"
        exit 0
    fi
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.5
done
tail -n 20 "$LOG_DIR/dockerd.log" >&2 || true
die "dockerd did not start: its log's last lines are above"
