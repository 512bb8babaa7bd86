#!/usr/bin/env bash
# tools/make_certs: a CA and two node certificates that `openssl verify` accepts for their IP and DNS
# names and for both TLS roles, keys 0600, runs that repeat keep the files, and the refusals.
set -euo pipefail
make_certs=${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}/tools/make_certs
[ -x "$make_certs" ] || { echo "make_certs_test: $make_certs not found"; exit 1; }
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/make_certs.XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "make_certs_test: FAIL: $*"; exit 1; }
out=$dir/certs

"$make_certs" --out="$out" --ca >/dev/null
"$make_certs" --out="$out" --node=n1 --ip=198.18.0.1 --dns=host1 >/dev/null
"$make_certs" --out="$out" --node=n2 --ip=198.18.0.2,198.18.1.2 --dns=host2 --dns=host2.cluster >/dev/null

for f in ca n1 n2; do
  [ "$(stat -c %a "$out/$f.key")" = 600 ] || fail "$f.key has mode $(stat -c %a "$out/$f.key"), want 600"
done
openssl x509 -in "$out/ca.pem" -noout -ext basicConstraints | grep -q 'CA:TRUE' || fail "ca.pem is not a CA"

verify() {  # verify CERT OPENSSL_VERIFY_ARGS...
  local cert=$1
  shift
  openssl verify -CAfile "$out/ca.pem" "$@" "$out/$cert.pem" >/dev/null 2>&1 || fail "openssl verify $* $cert.pem"
}
verify n1 -purpose sslserver -verify_ip 198.18.0.1
verify n1 -purpose sslclient -verify_hostname host1
verify n2 -purpose sslserver -verify_ip 198.18.0.2
verify n2 -purpose sslserver -verify_ip 198.18.1.2
verify n2 -purpose sslclient -verify_hostname host2.cluster
# The name check is real: n1's certificate does not hold n2's address.
if openssl verify -CAfile "$out/ca.pem" -verify_ip 198.18.0.2 "$out/n1.pem" >/dev/null 2>&1; then
  fail "n1.pem verified for 198.18.0.2"
fi

sans() { openssl x509 -in "$out/$1.pem" -noout -ext subjectAltName | sed -n 2p | sed 's/^ *//'; }
[ "$(sans n1)" = "IP Address:198.18.0.1, DNS:host1" ] || fail "n1 SANs: $(sans n1)"
[ "$(sans n2)" = "IP Address:198.18.0.2, IP Address:198.18.1.2, DNS:host2, DNS:host2.cluster" ] || fail "n2 SANs: $(sans n2)"
for n in n1 n2; do
  openssl x509 -in "$out/$n.pem" -noout -ext extendedKeyUsage | grep -q 'TLS Web Server Authentication, TLS Web Client Authentication' \
    || fail "$n.pem lacks extendedKeyUsage serverAuth,clientAuth"
  # The key is the certificate's.
  [ "$(openssl x509 -in "$out/$n.pem" -noout -pubkey)" = "$(openssl pkey -in "$out/$n.key" -pubout)" ] || fail "$n.key is not $n.pem's"
done

# A user's client certificate: no addresses needed, clientAuth only, signed by the CA.
"$make_certs" --out="$out" --client=alice >/dev/null
[ "$(stat -c %a "$out/alice.key")" = 600 ] || fail "alice.key has mode $(stat -c %a "$out/alice.key"), want 600"
verify alice -purpose sslclient
if openssl verify -CAfile "$out/ca.pem" -purpose sslserver "$out/alice.pem" >/dev/null 2>&1; then
  fail "alice.pem verified as a server certificate"
fi
[ "$(openssl x509 -in "$out/alice.pem" -noout -pubkey)" = "$(openssl pkey -in "$out/alice.key" -pubout)" ] || fail "alice.key is not alice.pem's"

# Repeating a run keeps every file as it was.
before=$(sha256sum "$out"/*)
"$make_certs" --out="$out" --ca | grep -q kept || fail "a second --ca did not say it kept the CA"
"$make_certs" --out="$out" --node=n1 --ip=198.18.0.1 --dns=host1 | grep -q kept || fail "a second --node=n1 did not keep it"
"$make_certs" --out="$out" --client=alice | grep -q kept || fail "a second --client=alice did not keep it"
[ "$before" = "$(sha256sum "$out"/*)" ] || fail "a repeated run changed files"
[ -z "$(find "$out" -name '.make_certs.*')" ] || fail "temporary files left in $out"

# Refusals: exit non-zero with a line that says what to do.
refused() {  # refused WANT_TEXT ARGS...
  local want=$1
  shift
  local msg rc=0
  msg=$("$make_certs" "$@" 2>&1) || rc=$?
  [ "$rc" -ne 0 ] || fail "make_certs $* succeeded"
  grep -qF -- "$want" <<<"$msg" || fail "make_certs $*: '$msg' does not say '$want'"
}
refused "run tools/make_certs --out=$dir/empty --ca first" --out="$dir/empty" --node=n1 --ip=198.18.0.1
[ ! -e "$dir/empty" ] || fail "a refused --node created its --out directory"
refused "exists with other addresses" --out="$out" --node=n1 --ip=198.18.0.9
refused "is not an IPv4 or IPv6 address" --out="$out" --node=n3 --ip=198.18.0.256
refused "needs its addresses" --out="$out" --node=n3
refused "a name of letters" --out="$out" --node=../evil --ip=198.18.0.3
refused "pass --ca or --node=NAME, not both" --out="$out" --ca --node=n3
refused "pass them with --node=NAME" --out="$out" --ca --ip=198.18.0.3
refused "unknown argument" --out="$out" --ca --force
refused "needs no --ip or --dns" --out="$out" --client=bob --ip=198.18.0.3
refused "pass one of --ca, --node=NAME and --client=NAME" --out="$out" --client=bob --node=n3
refused "a name of letters" --out="$out" --client=../evil
[ "$before" = "$(sha256sum "$out"/*)" ] || fail "a refused run changed files"
echo "make_certs_test: PASS"
