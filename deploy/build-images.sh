#!/usr/bin/env bash
# The images docker-compose*.yml run: Flower's flwr/superlink, flwr/supernode
# and flwr/superexec at the pinned Flower version (pulled from Docker Hub, or,
# where they cannot be pulled, built here as local stand-ins), and with -a the
# app image fedweigh-superexec (the repository's Dockerfile).
#
# usage: deploy/build-images.sh [-v VERSION] [-l] [-a] [-t TORCH_INDEX_URL]
#
#   -v VERSION   Flower version of the images (default: the Dockerfile's FLWR_VERSION)
#   -l           build the stand-ins without trying `docker pull` first
#   -a           also build fedweigh-superexec:VERSION from the Dockerfile
#   -t URL       where the app image's PyTorch comes from (the Dockerfile's
#                TORCH_INDEX_URL); "" is PyPI's default wheels (with CUDA).
#                Default: the Dockerfile's CPU-only index where it answers,
#                else PyPI's default (said so)
#
# An image already present is kept (docker's build cache makes a rebuild of an
# unchanged image take seconds). A user with a registry gets Flower's official
# images by `docker pull` and never builds a stand-in.
#
# The stand-ins (deploy/flower-images/Dockerfile) keep the official images'
# entrypoints, user (app, uid 49999, home and WORKDIR /app) and virtual
# environment (/python/venv), on Debian 12 with its Python 3.11, made with
# mmdebstrap (or debootstrap) from Debian's packages and imported as
# fedweigh-stand-in/debian:bookworm. Builds run on the host's network
# (`docker build --network host`), with the CA bundle of $FEDWEIGH_BUILD_CA_BUNDLE
# (default: $PIP_CERT, $SSL_CERT_FILE or /etc/ssl/certs/ca-certificates.crt)
# added to the stand-ins' trusted certificates, so pip reaches the package
# registry wherever the host's pip does. Needs root (or the docker group) and,
# for the stand-ins, root and mmdebstrap or debootstrap.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
version="$(sed -n 's/^ARG FLWR_VERSION=//p' "$repo/Dockerfile" | head -1)"
pull=1
app=0
torch_index="auto"
while getopts "v:lat:h" opt; do
  case "$opt" in
    v) version="$OPTARG" ;;
    l) pull=0 ;;
    a) app=1 ;;
    t) torch_index="$OPTARG" ;;
    h) sed -n '2,30p' "$0"; exit 0 ;;
    *) sed -n '2,30p' "$0" >&2; exit 2 ;;
  esac
done
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "build-images: -v VERSION must be a Flower release such as 1.41.0, got '$version'" >&2
  exit 2
fi
command -v docker >/dev/null || { echo "build-images: docker not found" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "build-images: no Docker engine answers (docker info failed)" >&2; exit 1; }
export DOCKER_BUILDKIT=0  # the classic builder: it needs no frontend image from a registry

base_image="fedweigh-stand-in/debian:bookworm"
present() { docker image inspect "$1" >/dev/null 2>&1; }
stamp() { date +%s.%N; }
took() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(stamp)"; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# Run a build step quietly; on failure show the end of its output.
logged() {
  local log="$scratch/$1.log"
  shift
  if ! "$@" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "build-images: failed: $*" >&2
    exit 1
  fi
}

base() {
  present "$base_image" && return 0
  local started="$(stamp)"
  if command -v mmdebstrap >/dev/null; then
    logged rootfs mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
      "$scratch/rootfs.tar"
  elif command -v debootstrap >/dev/null; then
    logged rootfs debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
      "$scratch/rootfs"
    tar -C "$scratch/rootfs" -cf "$scratch/rootfs.tar" .
    rm -rf "$scratch/rootfs"
  else
    echo "build-images: the stand-ins need mmdebstrap or debootstrap (apt-get install mmdebstrap)" >&2
    exit 1
  fi
  logged import docker import "$scratch/rootfs.tar" "$base_image"
  rm -f "$scratch/rootfs.tar"
  echo "$base_image: made from Debian's packages in $(took "$started") s"
}

stand_in() {
  local component="$1" context="$scratch/context" started
  base
  started="$(stamp)"
  mkdir -p "$context"
  cp "$repo/deploy/flower-images/Dockerfile" "$context/"
  local bundle="${FEDWEIGH_BUILD_CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
  if [[ -s "$bundle" ]]; then cp "$bundle" "$context/build-host-ca.crt"; else : >"$context/build-host-ca.crt"; fi
  logged "$component" docker build --network host --target "$component" --build-arg "FLWR_VERSION=$version" \
    --build-arg "BASE_IMAGE=$base_image" -t "flwr/$component:$version" "$context"
  echo "flwr/$component:$version: stand-in built in $(took "$started") s"
}

for component in superlink supernode superexec; do
  image="flwr/$component:$version"
  if present "$image"; then
    echo "$image: present"
  elif [[ $pull -eq 1 ]] && docker pull --quiet "$image" >/dev/null 2>&1; then
    echo "$image: pulled"
  else
    stand_in "$component"
  fi
done

if [[ $app -eq 1 ]]; then
  if [[ "$torch_index" == "auto" ]]; then
    torch_index="$(sed -n 's/^ARG TORCH_INDEX_URL=//p' "$repo/Dockerfile" | head -1)"
    if ! python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15)" "$torch_index/" \
      >/dev/null 2>&1; then
      echo "build-images: $torch_index does not answer: PyTorch from PyPI's default wheels (with CUDA; a larger image)"
      torch_index=""
    fi
  fi
  started="$(stamp)"
  logged app docker build --network host --build-arg "FLWR_VERSION=$version" \
    --build-arg "TORCH_INDEX_URL=$torch_index" -t "fedweigh-superexec:$version" "$repo"
  size="$(docker image inspect --format '{{.Size}}' "fedweigh-superexec:$version")"
  pypi="PyPI's default wheels"
  source="${torch_index:-$pypi}"
  echo "fedweigh-superexec:$version: built in $(took "$started") s, $((size / 1000000)) MB (PyTorch from $source)"
fi
