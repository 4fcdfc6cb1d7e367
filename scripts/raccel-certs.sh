#!/usr/bin/env bash
# Makes the pool's certificate authority and issues the certificates the scheduler and
# each netaccel present on their mutual-TLS link (transport/tls.h). Uses Debian's openssl.
#
# usage:
#   raccel-certs.sh ca DIR                 the pool CA: DIR/ca.pem, DIR/ca.key (keep it secret)
#   raccel-certs.sh scheduler DIR          DIR/scheduler.pem, DIR/scheduler.key (DNS name raccel-scheduler)
#   raccel-certs.sh node DIR NAME          DIR/NAME.pem, DIR/NAME.key: a netaccel's; NAME is its node name
#   raccel-certs.sh all DIR NAME...        the CA (if absent), the scheduler's and one per NAME
#   raccel-certs.sh etcd DIR [HOST...]     for etcd's own TLS (its client URLs https, with
#                                          --client-cert-auth): DIR/etcd-server.pem/.key for
#                                          the members (HOSTs: their addresses or names; default
#                                          127.0.0.1 localhost), DIR/etcd-client.pem/.key for
#                                          the schedulers and netaccels (etcd_ca, etcd_cert, etcd_key)
#
# The scheduler admits a netaccel only with a certificate of this CA, and takes the
# node's name from its common name. Keys are P-256, certificates valid for DAYS (825).
set -euo pipefail

usage() {
  # The comment block at the top, up to the first line that is not a comment.
  sed -n '2,/^[^#]/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage 0 ;; esac
command -v openssl >/dev/null || { echo "raccel-certs.sh: openssl is missing (apt-get install openssl)" >&2; exit 1; }
days=${DAYS:-825}

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 600 "$1"; }

make_ca() {
  local dir=$1
  mkdir -p "$dir"
  [ -f "$dir/ca.pem" ] && return 0
  key "$dir/ca.key"
  openssl req -x509 -new -key "$dir/ca.key" -subj "/CN=raccel pool CA" -days "$days" -sha256 \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$dir/ca.pem" 2>/dev/null
  echo "raccel-certs.sh: pool CA in $dir/ca.pem"
}

# issue DIR FILE CN EXTENSIONS...
issue() {
  local dir=$1 file=$2 cn=$3
  shift 3
  [ -f "$dir/ca.pem" ] || { echo "raccel-certs.sh: no CA in $dir (run: raccel-certs.sh ca $dir)" >&2; exit 1; }
  local ext
  ext=$(mktemp)
  printf '%s\n' "$@" > "$ext"
  key "$dir/$file.key"
  openssl req -new -key "$dir/$file.key" -subj "/CN=$cn" -out "$dir/$file.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$file.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days "$days" \
    -sha256 -extfile "$ext" -out "$dir/$file.pem" 2>/dev/null
  rm -f "$dir/$file.csr" "$ext"
  echo "raccel-certs.sh: $cn in $dir/$file.pem"
}

scheduler_cert() {
  issue "$1" scheduler raccel-scheduler "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=serverAuth" "subjectAltName=DNS:raccel-scheduler"
}

node_cert() {
  local dir=$1 name=$2
  [[ "$name" =~ ^[A-Za-z0-9._-]{1,64}$ ]] || { echo "raccel-certs.sh: '$name' is not a node name (letters, digits, . _ -)" >&2; exit 1; }
  issue "$dir" "$name" "$name" "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth"
}

etcd_certs() {
  local dir=$1 san="" host
  shift
  [ $# -gt 0 ] || set -- 127.0.0.1 localhost
  for host in "$@"; do
    if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then san+="${san:+,}IP:$host"
    elif [[ "$host" =~ ^[A-Za-z0-9.-]{1,253}$ ]]; then san+="${san:+,}DNS:$host"
    else echo "raccel-certs.sh: '$host' is not an address or host name" >&2; exit 1; fi
  done
  make_ca "$dir"
  issue "$dir" etcd-server etcd "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san"
  issue "$dir" etcd-client raccel "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth"
}

case "$1" in
  ca) [ $# -eq 2 ] || usage; make_ca "$2" ;;
  etcd) [ $# -ge 2 ] || usage; d=$2; shift 2; etcd_certs "$d" "$@" ;;
  scheduler) [ $# -eq 2 ] || usage; scheduler_cert "$2" ;;
  node) [ $# -eq 3 ] || usage; node_cert "$2" "$3" ;;
  all)
    [ $# -ge 2 ] || usage
    dir=$2
    shift 2
    make_ca "$dir"
    [ -f "$dir/scheduler.pem" ] || scheduler_cert "$dir"
    for name in "$@"; do [ -f "$dir/$name.pem" ] || node_cert "$dir" "$name"; done
    ;;
  *) usage ;;
esac
