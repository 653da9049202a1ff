#!/usr/bin/env bash
# Make a private CA and a SuperLink TLS certificate signed by it (openssl).
#
# usage: deploy/make-certificates.sh [-o DIR] [-n NAME]... [-i IP]... [-d DAYS] [-f]
#
#   -o DIR   where to write the files (default: deploy/certificates)
#   -n NAME  a DNS name of the SuperLink, e.g. superlink.example.org (repeatable;
#            default: superlink, the service name in docker-compose*.yml)
#   -i IP    an IP address of the SuperLink, e.g. 10.0.0.5 (repeatable)
#   -d DAYS  validity of the CA and the server certificate (default: 365)
#   -f       overwrite existing files (the CA is otherwise kept and reused)
#
# Every name and address that SuperNodes and the `flwr` CLI use to reach the
# SuperLink must be a subject alternative name (SAN) of the certificate, or
# TLS verification fails. localhost and 127.0.0.1 are always added: with
# `--isolation subprocess`, the SuperLink's own SuperExec and ServerApp reach it
# on 127.0.0.1 when it listens on 0.0.0.0.
#
# Files written to DIR:
#   ca.crt       the CA certificate: give it to every SuperNode (--root-certificates)
#                and to every `flwr` user (root-certificates in ~/.flwr/config.toml)
#   ca.key       the CA private key: keep it offline, never ship it
#   server.crt   the SuperLink certificate (--ssl-certfile)
#   server.key   the SuperLink private key (--ssl-keyfile)
#
# Keys are ECDSA P-384. The private keys are readable by their owner only; a
# container that runs as another user (Flower's images run as uid 49999) needs
# `chown 49999:49999 server.key` on the host (see docs/deployment.md).
set -euo pipefail

out="$(cd "$(dirname "$0")" && pwd)/certificates"
names=()
ips=()
days=365
force=0

while getopts "o:n:i:d:fh" opt; do
  case "$opt" in
    o) out="$OPTARG" ;;
    n) names+=("$OPTARG") ;;
    i) ips+=("$OPTARG") ;;
    d) days="$OPTARG" ;;
    f) force=1 ;;
    h) sed -n '2,31p' "$0"; exit 0 ;;
    *) sed -n '2,31p' "$0" >&2; exit 2 ;;
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
command -v openssl >/dev/null || { echo "make-certificates: openssl not found" >&2; exit 1; }

mkdir -p "$out"
umask 077

san="DNS:localhost,IP:127.0.0.1"
for name in "${names[@]}"; do san+=",DNS:$name"; done
for ip in ${ips[@]+"${ips[@]}"}; do san+=",IP:$ip"; done

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

openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -sha384 -nodes \
  -keyout "$out/server.key" -out "$out/server.csr" \
  -subj "/CN=${names[0]}" 2>/dev/null
ext="$(mktemp)"
trap 'rm -f "$ext"' EXIT
cat >"$ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$san
EXT
openssl x509 -req -sha384 -days "$days" -in "$out/server.csr" \
  -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -out "$out/server.crt" -extfile "$ext" 2>/dev/null
rm -f "$out/server.csr" "$out/ca.srl"
chmod 644 "$out/ca.crt" "$out/server.crt"  # certificates are public
chmod 600 "$out/ca.key" "$out/server.key"

openssl verify -CAfile "$out/ca.crt" "$out/server.crt" >/dev/null
echo "server cert: $out/server.crt (key $out/server.key)"
echo "SANs:        $san"
