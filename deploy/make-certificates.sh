#!/usr/bin/env bash
# Make a private CA and a SuperLink TLS certificate signed by it (openssl), and
# optionally certificates for SuperNodes' Runtime APIs.
#
# usage: deploy/make-certificates.sh [-o DIR] [-n NAME]... [-i IP]... [-s NODE]... [-c COUNT] [-d DAYS] [-L] [-f]
#
#   -o DIR    where to write the files (default: deploy/certificates)
#   -n NAME   a DNS name of the SuperLink, e.g. superlink.example.org (repeatable;
#             default: superlink, the service name in docker-compose*.yml)
#   -i IP     an IP address of the SuperLink, e.g. 10.0.0.5 (repeatable)
#   -s NODE   also a certificate for the Runtime API of SuperNode NODE, the name
#             its SuperExec reaches it by, e.g. supernode-1 (repeatable)
#   -c COUNT  as -s for supernode-1 ... supernode-COUNT (docker-compose*.yml)
#   -d DAYS   validity of the CA and the certificates (default: 365)
#   -L        leave out localhost and 127.0.0.1 (see below)
#   -f        overwrite existing files (the CA is otherwise kept and reused)
#
# Every name and address that SuperNodes and the `flwr` CLI use to reach the
# SuperLink must be a subject alternative name (SAN) of the certificate, or
# TLS verification fails. localhost and 127.0.0.1 are added unless -L: with
# `--isolation subprocess`, the SuperLink's own SuperExec and ServerApp reach it
# on 127.0.0.1 when it listens on 0.0.0.0.
#
# Files written to DIR:
#   ca.crt       the CA certificate: give it to every SuperNode (--root-certificates)
#                and to every `flwr` user (root-certificates in ~/.flwr/config.toml)
#   ca.key       the CA private key: keep it offline, never ship it
#   server.crt   the SuperLink certificate (--ssl-certfile)
#   server.key   the SuperLink private key (--ssl-keyfile)
#   NODE.crt     with -s/-c: SuperNode NODE's Runtime API certificate
#   NODE.key     (flower-supernode --ssl-certfile, --ssl-keyfile, with
#                --ssl-ca-certfile ca.crt; its SuperExec: --root-certificates ca.crt)
#
# Keys are ECDSA P-384. The private keys are readable by their owner only; a
# container that runs as another user (Flower's images run as uid 49999) needs
# `chown 49999:49999 server.key NODE.key` on the host (see docs/deployment.md).
set -euo pipefail

out="$(cd "$(dirname "$0")" && pwd)/certificates"
names=()
ips=()
nodes=()
count=""
days=365
loopback=1
force=0

while getopts "o:n:i:s:c:d:Lfh" opt; do
  case "$opt" in
    o) out="$OPTARG" ;;
    n) names+=("$OPTARG") ;;
    i) ips+=("$OPTARG") ;;
    s) nodes+=("$OPTARG") ;;
    c) count="$OPTARG" ;;
    d) days="$OPTARG" ;;
    L) loopback=0 ;;
    f) force=1 ;;
    h) sed -n '2,36p' "$0"; exit 0 ;;
    *) sed -n '2,36p' "$0" >&2; exit 2 ;;
  esac
done

if [[ ${#names[@]} -eq 0 ]]; then
  names=(superlink)
fi
if ! [[ "$days" =~ ^[1-9][0-9]*$ ]]; then
  echo "make-certificates: -d DAYS must be a positive integer, got '$days'" >&2
  exit 2
fi
for ip in ${ips[@]+"${ips[@]}"}; do
  if ! [[ "$ip" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ || "$ip" == *:* ]]; then
    echo "make-certificates: -i expects an IPv4 or IPv6 address, got '$ip'" >&2
    exit 2
  fi
done
if [[ -n "$count" ]]; then
  if ! [[ "$count" =~ ^[1-9][0-9]*$ ]]; then
    echo "make-certificates: -c COUNT must be a positive integer, got '$count'" >&2
    exit 2
  fi
  for ((i = 1; i <= count; i++)); do nodes+=("supernode-$i"); done
fi
for node in ${nodes[@]+"${nodes[@]}"}; do
  if ! [[ "$node" =~ ^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]]; then
    echo "make-certificates: -s expects a host name (letters, digits, '.', '-'), got '$node'" >&2
    exit 2
  fi
  if [[ "$node" == server || "$node" == ca ]]; then
    echo "make-certificates: -s $node would overwrite $node.crt" >&2
    exit 2
  fi
done
command -v openssl >/dev/null || { echo "make-certificates: openssl not found" >&2; exit 1; }

mkdir -p "$out"
umask 077

local_sans=""
if [[ $loopback -eq 1 ]]; then
  local_sans=",DNS:localhost,IP:127.0.0.1"
fi
san=""
for name in "${names[@]}"; do san+=",DNS:$name"; done
for ip in ${ips[@]+"${ips[@]}"}; do san+=",IP:$ip"; done
san="${san#,}$local_sans"

if [[ $force -eq 1 || ! -s "$out/ca.key" || ! -s "$out/ca.crt" ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -sha384 -nodes -days "$days" \
    -keyout "$out/ca.key" -out "$out/ca.crt" \
    -subj "/CN=fedweigh federation CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  echo "CA:          $out/ca.crt (key $out/ca.key)"
else
  echo "CA:          $out/ca.crt (kept; -f makes a new one)"
fi

ext="$(mktemp)"
trap 'rm -f "$ext"' EXIT

# issue FILE CN SANS: FILE.crt and FILE.key, a server certificate signed by the CA
issue() {
  local file="$1" cn="$2" sans="$3"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -sha384 -nodes \
    -keyout "$out/$file.key" -out "$out/$file.csr" \
    -subj "/CN=$cn" 2>/dev/null
  cat >"$ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$sans
EXT
  openssl x509 -req -sha384 -days "$days" -in "$out/$file.csr" \
    -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -out "$out/$file.crt" -extfile "$ext" 2>/dev/null
  rm -f "$out/$file.csr" "$out/ca.srl"
  chmod 644 "$out/$file.crt"  # certificates are public
  chmod 600 "$out/$file.key"
  openssl verify -CAfile "$out/ca.crt" "$out/$file.crt" >/dev/null
}

chmod 644 "$out/ca.crt"
chmod 600 "$out/ca.key"
issue server "${names[0]}" "$san"
echo "server cert: $out/server.crt (key $out/server.key)"
echo "SANs:        $san"
for node in ${nodes[@]+"${nodes[@]}"}; do
  issue "$node" "$node" "DNS:$node$local_sans"
  echo "$node: $out/$node.crt (key $out/$node.key), SANs DNS:$node$local_sans"
done
