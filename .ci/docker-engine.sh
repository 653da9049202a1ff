#!/usr/bin/env bash
# A Docker engine for the container test (tests/test_containers.py), where one
# can be had: one that answers already, else Debian's docker.io and
# docker-compose (with mmdebstrap, for deploy/build-images.sh's stand-ins)
# installed with apt-get and dockerd started in the background (its log:
# /tmp/fedweigh-dockerd.log). Prints nothing and exits 0 when an engine
# answers; otherwise prints why not and exits 1.
set -uo pipefail

answers() { docker info >/dev/null 2>&1; }
compose() { docker compose version >/dev/null 2>&1 || docker-compose version >/dev/null 2>&1; }
if answers && compose; then exit 0; fi
if [[ $(id -u) -ne 0 ]]; then echo "not root: cannot install or start a Docker engine"; exit 1; fi
if ! command -v apt-get >/dev/null; then echo "no apt-get to install a Docker engine with"; exit 1; fi
packages=(docker.io docker-compose mmdebstrap)
if ! dpkg -s "${packages[@]}" >/dev/null 2>&1; then
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}"; } \
      >/tmp/fedweigh-apt.log 2>&1; then
    echo "apt-get install ${packages[*]} failed: $(tail -n 1 /tmp/fedweigh-apt.log)"
    exit 1
  fi
fi
if ! answers; then
  command -v dockerd >/dev/null || { echo "dockerd not found after installing docker.io"; exit 1; }
  nohup dockerd >/tmp/fedweigh-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do answers && break; sleep 1; done
  answers || { echo "dockerd did not answer within 60 s: $(tail -n 1 /tmp/fedweigh-dockerd.log)"; exit 1; }
fi
compose || { echo "no docker compose and no docker-compose"; exit 1; }
