#!/usr/bin/env bash
# A private Docker engine for the real-engine test (tests/lanes/test_docker_backend.py), started
# where the machine allows it (root, Debian's docker.io), plus what that test's image build
# needs without any image registry: a debootstrapped Debian base image (`docker import`) and
# the wheels of selgate's dependencies in .whl/ (torch's CPU build from the local disk).
# Writes build/docker-engine.env: DOCKER_HOST and the base image, or, when anything fails,
# DOCKER_UNAVAILABLE=<reason> (the test skips with it) and exits non-zero.
# Usage: bash .ci/docker_engine.sh [stop]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
STATE=${SELGATE_DOCKER_STATE:-/var/lib/selgate-docker}
SOCK=$STATE/run/docker.sock
PIDFILE=$STATE/dockerd.pid
ENV_FILE=build/docker-engine.env
BASE_IMAGE=selgate/debian-base:bookworm
TORCH_VERSION=2.13.0
TRITON_VERSION=3.6.0
export DOCKER_HOST=unix://$SOCK

say() { echo "docker engine [${SECONDS}s]: $*"; }
unavailable() {
  say "unavailable: $*" >&2
  printf 'DOCKER_UNAVAILABLE=%s\n' "$*" > "$ENV_FILE"
  exit 1
}
engine_up() { docker info >/dev/null 2>&1; }

if [ "${1:-}" = stop ]; then
  [ -f "$PIDFILE" ] && kill "$(cat "$PIDFILE")" 2>/dev/null && say "stopped dockerd $(cat "$PIDFILE")"
  rm -f "$ENV_FILE"
  exit 0
fi

mkdir -p build
[ "$(id -u)" = 0 ] || unavailable "not root (dockerd needs root here)"
mkdir -p "$STATE/run"
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  say "installing docker.io and debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { apt-get install -y -q --no-install-recommends docker.io debootstrap >"$STATE/apt.log" 2>&1; }
  apt_install || { apt-get update -q >>"$STATE/apt.log" 2>&1 && apt_install; } \
    || unavailable "apt-get install docker.io debootstrap failed (see $STATE/apt.log)"
fi

# overlay2 where the kernel and file system allow it (each build step is a full copy on vfs).
storage_driver() {
  local probe
  probe=$(mktemp -d "$STATE/overlay-probe.XXXXXX")
  mkdir -p "$probe"/{lower,upper,work,merged}
  if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
      "$probe/merged" 2>/dev/null; then
    umount "$probe/merged"
    echo overlay2
  else
    echo vfs
  fi
  rm -rf "$probe"
}

if ! engine_up; then
  driver=${SELGATE_DOCKER_STORAGE_DRIVER:-$(storage_driver)}
  say "starting dockerd on $SOCK ($driver storage, no iptables, no bridge)"
  setsid dockerd --host="$DOCKER_HOST" --data-root="$STATE/data" --exec-root="$STATE/exec" \
    --pidfile="$PIDFILE" --storage-driver="$driver" --iptables=false --ip-masq=false --bridge=none \
    >"$STATE/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 60); do engine_up && break; sleep 1; done
  engine_up || unavailable "dockerd did not come up in 60 s: $(tail -n 1 "$STATE/dockerd.log")"
fi
say "engine up: $(docker info --format 'server {{.ServerVersion}}, storage {{.Driver}}')"
# Earlier runs' superseded test images (full copies of the root on vfs) would pile up.
docker image prune -f >/dev/null

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  say "making $BASE_IMAGE with debootstrap (minbase + python3)"
  rootfs=$STATE/rootfs
  rm -rf "$rootfs"
  timeout 900 debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" \
      >"$STATE/debootstrap.log" 2>&1 \
    || unavailable "debootstrap failed: $(tail -n 1 "$STATE/debootstrap.log")"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
  tar -C "$rootfs" -c . | docker import --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null \
    || unavailable "docker import of the debootstrapped root failed"
  rm -rf "$rootfs"
fi
say "base image $BASE_IMAGE ready"

# The image installs with PIP_NO_INDEX=1 from .whl/: fetch the dependency closure (numpy for
# the Triton interpreter) for the base image's Python (3.11) through this machine's pip
# (local wheels and cache first).
python3 docker/requirements.py pyproject.toml > build/docker-requirements.txt
timeout 600 python3 -m pip download -q -d .whl --find-links .whl --only-binary=:all: --python-version 3.11 \
    "torch==$TORCH_VERSION" "triton==$TRITON_VERSION" "setuptools>=68" numpy \
    -r build/docker-requirements.txt >"$STATE/pip.log" 2>&1 \
  || unavailable "pip download of the image's wheels failed: $(tail -n 1 "$STATE/pip.log")"
torch_wheels=(.whl/torch-"$TORCH_VERSION"*.whl)
say "wheels ready in .whl/ (torch: ${torch_wheels[*]#.whl/})"

printf 'DOCKER_HOST=%s\nSELGATE_DOCKER_BASE_IMAGE=%s\nSELGATE_DOCKER_OFFLINE=1\n' \
  "$DOCKER_HOST" "$BASE_IMAGE" > "$ENV_FILE"
say "ready; wrote $ENV_FILE"
