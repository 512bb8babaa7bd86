#!/usr/bin/env bash
# Remote control across two hosts: a server (`launcher --serve`) in one network namespace and the
# client in another, joined by a veth pair (198.18.0.1 and .2), over mutual TLS with certificates made
# here. Submits a tiny CPU training job, watches it to the end (every step streamed, then the final
# state and exit code), fetches steps.csv and compares it with the server's copy, lists the job. Then
# the refusals that need another host: a client certificate from another CA, a plaintext client, a
# server on a non-loopback address without TLS (exit 2, nothing created).
#
# Runs under `unshare --mount` with a private /etc/hosts, nsswitch.conf and resolv.conf (a DNS lookup
# inside a namespace would hang); the namespaces, and everything in them, are removed on any exit.
set -euo pipefail
if [ -z "${STAGEHAND_NETNS_TEST_INNER:-}" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "serve_netns_test: needs root (network namespaces)"; exit 1; }
  exec env STAGEHAND_NETNS_TEST_INNER=1 unshare --mount bash "$0" "$@"
fi
mount --make-rprivate /
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
launcher=$PWD/launcher/launcher
client=$PWD/client/client
[ -x "$launcher" ] && [ -x "$client" ] || { echo "serve_netns_test: launcher or client not found in $PWD"; exit 1; }

tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/serve_netns.XXXXXX")
ns_server=stagehand-srv-$$
ns_client=stagehand-cli-$$
server_pid=
cleanup() {
  local rc=$?
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  # Whatever is left in a namespace (a worker, a client) dies with it.
  for ns in "$ns_server" "$ns_client"; do
    if [ -e "/run/netns/$ns" ]; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
fail() { echo "serve_netns_test: FAIL: $*"; for f in "$tmp"/*.log "$tmp"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done; exit 1; }

# Name lookups: files only (the hostname is the same in both namespaces: addresses identify hosts).
printf '127.0.0.1 localhost\n198.18.0.1 server\n198.18.0.2 client\n' >"$tmp/hosts"
echo 'hosts: files' >"$tmp/nsswitch.conf"
: >"$tmp/resolv.conf"
mount --bind "$tmp/hosts" /etc/hosts
mount --bind "$tmp/nsswitch.conf" /etc/nsswitch.conf
mount --bind "$tmp/resolv.conf" /etc/resolv.conf

ip netns add "$ns_server"
ip netns add "$ns_client"
# Made directly inside the namespaces, so that nothing is ever left in the root namespace.
ip link add "vs$$" netns "$ns_server" type veth peer name "vc$$" netns "$ns_client"
ip -n "$ns_server" addr add 198.18.0.1/24 dev "vs$$"
ip -n "$ns_client" addr add 198.18.0.2/24 dev "vc$$"
for ns in "$ns_server" "$ns_client"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns_server" link set "vs$$" up
ip -n "$ns_client" link set "vc$$" up
in_server() { nsenter --net="/run/netns/$ns_server" "$@"; }
in_client() { nsenter --net="/run/netns/$ns_client" "$@"; }

# Certificates: a cluster CA, the server's (its address as an IP SAN), a client's, and a client's from
# another CA.
cd "$tmp"
openssl_quiet() { openssl "$@" >/dev/null 2>&1 || fail "openssl $*"; }
make_ca() { openssl_quiet req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.pem" -subj "/CN=$1" -days 2; }
make_leaf() {  # make_leaf NAME CA SAN
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" >"$1.ext"
  openssl_quiet req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$1"
  openssl_quiet x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" -days 2 -extfile "$1.ext"
}
make_ca ca
make_ca other-ca
make_leaf server ca "IP:198.18.0.1,DNS:localhost"
make_leaf alice ca "DNS:alice"
make_leaf mallory other-ca "DNS:mallory"

# A non-loopback server without TLS is refused at start, exit 2, creating nothing.
set +e
in_server "$launcher" --serve --listen=198.18.0.1:7444 --state_dir="$tmp/refused" >"$tmp/refused.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "a non-loopback --listen without TLS: exit $rc, not 2"
grep -q -- "--tls_cert" "$tmp/refused.out" || fail "the refusal does not say to pass --tls_cert"
[ ! -e "$tmp/refused" ] || fail "the refused server created its state directory"

in_server "$launcher" --serve --listen=198.18.0.1:7443 --state_dir="$tmp/state" --max_cpu_workers=2 \
  --tls_cert=server.pem --tls_key=server.key --tls_client_ca=ca.pem >"$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 300); do
  grep -q "serving on" "$tmp/server.log" && break
  kill -0 "$server_pid" 2>/dev/null || fail "the server exited"
  sleep 0.1
done
grep -q "serving on 198.18.0.1:7443" "$tmp/server.log" || fail "the server did not start within 30 s"
[ "$(stat -c %a "$tmp/state/admin.token")" = 600 ] || fail "admin.token is not mode 0600"

export STAGEHAND_SERVER=198.18.0.1:7443 STAGEHAND_TOKEN_FILE="$tmp/state/admin.token"
tls=(--tls_ca=ca.pem --tls_cert=alice.pem --tls_key=alice.key)
steps=12
in_client timeout 60 "$client" submit "${tls[@]}" --device=cpu --workers=2 --model=tiny --steps=$steps --fp32 \
  >"$tmp/submit.out" 2>&1 || fail "submit failed"
id=$(tail -n 1 "$tmp/submit.out")
[[ "$id" =~ ^[0-9a-f]+$ ]] || fail "submit's last line is not a job id: '$id'"

set +e
in_client timeout 120 "$client" watch "${tls[@]}" "$id" >"$tmp/watch.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 0 ] || fail "watch exited $rc, not the job's 0"
streamed=$(grep -cE "step [0-9]+/$steps " "$tmp/watch.out" || true)
[ "$streamed" -eq "$steps" ] || fail "watch showed $streamed step lines, not $steps"
grep -q "stagehand: done" "$tmp/watch.out" || fail "watch did not show the run's last line"
tail -n 3 "$tmp/watch.out" | grep -qi "succeeded" || fail "watch did not end with the final state"

in_client timeout 30 "$client" fetch "${tls[@]}" "$id" steps.csv --output="$tmp/fetched.csv" >"$tmp/fetch.out" 2>&1 ||
  fail "fetch failed"
cmp "$tmp/fetched.csv" "$tmp/state/runs/$id/steps.csv" || fail "the fetched steps.csv differs from the server's"
[ "$(grep -c . "$tmp/fetched.csv")" -gt "$steps" ] || fail "steps.csv has fewer rows than steps"

in_client timeout 30 "$client" list "${tls[@]}" >"$tmp/list.out" 2>&1 || fail "list failed"
grep -q "$id" "$tmp/list.out" || fail "list does not show job $id"

# A client certificate from another CA: refused, with a line that says what to check.
set +e
in_client timeout 30 "$client" list --tls_ca=ca.pem --tls_cert=mallory.pem --tls_key=mallory.key >"$tmp/mallory.out" 2>&1
rc=$?
in_client timeout 30 "$client" list >"$tmp/plaintext.out" 2>&1
rc_plain=$?
set -e
[ "$rc" -ne 0 ] || fail "a client certificate from another CA was accepted"
grep -q -- "--tls_cert" "$tmp/mallory.out" || fail "the foreign-CA refusal does not say what to check: $(cat "$tmp/mallory.out")"
[ "$rc_plain" -ne 0 ] || fail "a plaintext client was served"
grep -qi "tls" "$tmp/plaintext.out" || fail "the plaintext refusal does not mention TLS: $(cat "$tmp/plaintext.out")"

kill -TERM "$server_pid"
for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$server_pid" 2>/dev/null && fail "the server did not stop within 10 s of SIGTERM"
server_pid=
echo "serve_netns_test: ok (job $id: $streamed steps streamed over mutual TLS, steps.csv fetched and equal)"
