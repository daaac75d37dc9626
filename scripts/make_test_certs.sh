#!/usr/bin/env bash
# Writes a throw-away PKI for pipetrain's mTLS into DIR (created if missing), valid for 30 days:
#   ca.pem ca.key                   the cluster CA (give ca.pem to every process as --tls-ca)
#   coordinator.pem coordinator.key the coordinator (server and client use)
#   worker-N.pem worker-N.key       workers 0..WORKERS-1 (server and client use)
#   client.pem client.key           a user of the client API (client use only, names no host, so
#                                   it cannot register as a worker)
#   worker-wronghost.pem/.key       a worker certificate naming only wronghost.invalid (tests)
#   other-ca.pem other-ca.key       a second, unrelated CA, and other-worker.pem/.key signed by it
#                                   (tests: a certificate from another CA is refused)
#   tokens                          one random client token per line (for --auth-token-file)
# Coordinator and worker certificates name 127.0.0.1 and localhost plus every HOST given (an IP
# address or a DNS name), so they serve on loopback and on those hosts; a worker's certificate
# must name the host it advertises (docs/security.md).
# Usage: scripts/make_test_certs.sh DIR [HOST...]    Env: WORKERS (default 4), DAYS (default 30).
# Needs the openssl command (Debian package openssl). Keys are EC P-256, unencrypted: for tests
# and trials only; see docs/security.md for a production CA.
set -euo pipefail
if (($# < 1)); then
  echo "usage: $0 DIR [HOST...]" >&2
  exit 2
fi
dir=$1
shift
workers=${WORKERS:-4}
days=${DAYS:-30}
mkdir -p "$dir"
cd "$dir"
umask 077

names="IP:127.0.0.1,DNS:localhost"
for host in "$@"; do
  if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then
    names="$names,IP:$host"
  else
    names="$names,DNS:$host"
  fi
done

# new_ca NAME CN
new_ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$days" \
    -keyout "$1.key" -out "$1.pem" -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

# new_cert NAME CN CA EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]
new_cert() {
  local ext
  ext=$(mktemp)
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$4"
    if [[ -n ${5:-} ]]; then echo "subjectAltName=$5"; fi
  } >"$ext"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -days "$days" \
    -set_serial "0x$(openssl rand -hex 16)" -extfile "$ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$ext"
}

new_ca ca "pipetrain test CA"
new_cert coordinator coordinator ca serverAuth,clientAuth "$names"
for ((w = 0; w < workers; ++w)); do
  new_cert "worker-$w" "worker-$w" ca serverAuth,clientAuth "$names"
done
new_cert client client ca clientAuth
new_cert worker-wronghost worker-wronghost ca serverAuth,clientAuth "DNS:wronghost.invalid"
new_ca other-ca "unrelated CA"
new_cert other-worker other-worker other-ca serverAuth,clientAuth "$names"
for _ in 1 2; do openssl rand -hex 24; done >tokens
chmod 0644 ./*.pem
echo "wrote a test CA and certificates for $workers workers (names $names) to $PWD" >&2
