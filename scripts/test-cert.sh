#!/usr/bin/env bash
# A throwaway certificate authority and server certificates for tests and benchmarks (never for use
# outside them): DIR/ca.pem (trust this), and DIR/NAME.pem + DIR/NAME.key, valid for 127.0.0.1 and
# localhost for two days. The CA is made once per DIR; each NAME is a new key and certificate it signs.
#
#   scripts/test-cert.sh DIR [NAME]     (NAME defaults to server)
set -euo pipefail
DIR=${1:?DIR}
NAME=${2:-server}
command -v openssl >/dev/null || { echo "openssl is needed (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$DIR"
cd "$DIR"
if [[ ! -f ca.pem ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem \
    -days 2 -subj "/CN=Mosaic test CA" 2>/dev/null
fi
cat >"$NAME.ext" <<EXT
subjectAltName = IP:127.0.0.1, DNS:localhost
basicConstraints = CA:FALSE
keyUsage = digitalSignature
extendedKeyUsage = serverAuth
EXT
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$NAME.key" -out "$NAME.csr" \
  -subj "/CN=$NAME" 2>/dev/null
openssl x509 -req -in "$NAME.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$NAME.pem" -days 2 \
  -extfile "$NAME.ext" 2>/dev/null
rm -f "$NAME.csr" "$NAME.ext"
