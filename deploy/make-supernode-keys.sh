#!/usr/bin/env bash
# Make one EC key pair (NIST P-384, OpenSSH format) per SuperNode, for SuperNode
# authentication.
#
# usage: deploy/make-supernode-keys.sh [-o DIR] [-f] NAME...
#        deploy/make-supernode-keys.sh [-o DIR] [-f] -c COUNT
#
#   -o DIR    where to write the keys (default: deploy/keys)
#   -c COUNT  make keys for supernode-1 ... supernode-COUNT
#   -f        overwrite existing keys (they are otherwise kept)
#   NAME      a SuperNode name, e.g. hospital-a (letters, digits, '-', '_')
#
# Files written to DIR, per NAME:
#   NAME        the private key: stays on that SuperNode
#               (flower-supernode --auth-supernode-private-key DIR/NAME)
#   NAME.pub    the public key: the federation operator registers it with
#               `flwr supernode register DIR/NAME.pub <connection>`
#
# A SuperLink started with --enable-supernode-auth accepts only SuperNodes
# whose public key has been registered.
set -euo pipefail

out="$(cd "$(dirname "$0")" && pwd)/keys"
count=""
force=0
while getopts "o:c:fh" opt; do
  case "$opt" in
    o) out="$OPTARG" ;;
    c) count="$OPTARG" ;;
    f) force=1 ;;
    h) sed -n '2,22p' "$0"; exit 0 ;;
    *) sed -n '2,22p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

names=("$@")
if [[ -n "$count" ]]; then
  if ! [[ "$count" =~ ^[1-9][0-9]*$ ]]; then
    echo "make-supernode-keys: -c COUNT must be a positive integer, got '$count'" >&2
    exit 2
  fi
  for ((i = 1; i <= count; i++)); do names+=("supernode-$i"); done
fi
if [[ ${#names[@]} -eq 0 ]]; then
  echo "make-supernode-keys: give SuperNode names or -c COUNT (see -h)" >&2
  exit 2
fi
command -v ssh-keygen >/dev/null || { echo "make-supernode-keys: ssh-keygen not found (package openssh-client)" >&2; exit 1; }

mkdir -p "$out"
for name in "${names[@]}"; do
  if ! [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]]; then
    echo "make-supernode-keys: a name may hold letters, digits, '-' and '_', got '$name'" >&2
    exit 2
  fi
  if [[ -s "$out/$name" && $force -eq 0 ]]; then
    echo "$name: kept $out/$name (-f makes a new one)"
    continue
  fi
  rm -f "$out/$name" "$out/$name.pub"
  ssh-keygen -q -t ecdsa -b 384 -N "" -C "$name" -f "$out/$name"
  echo "$name: $out/$name, $out/$name.pub"
done
