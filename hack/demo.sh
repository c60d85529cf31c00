#!/usr/bin/env bash
# The demo a newcomer runs first (make demo, as root): a private network
# namespace with a bridge standing in for a VRF (this kernel has none) and
# three tenant taps — one held by a running process, one live per the
# inventory file, one stale — and galactic-node reclaiming the stale one
# over two forced passes, shown through its admin API with curl, and last
# the galactic-node client subcommands that replace that curl. It removes
# everything it made, also when interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${GALACTICTEST_NODE_BIN:-bin/galactic-node}
ns=galactic-demo-$$
work=$(mktemp -d /tmp/galactic-demo.XXXXXX)
pids=()

cleanup() {
	local rc=$?
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	mountpoint -q "$work/bpffs" && umount "$work/bpffs"
	ip netns del "$ns" 2>/dev/null || true
	rm -rf "$work"
	if [ "$rc" = 0 ]; then echo "demo: done, everything it made is removed"; else echo "demo: FAILED ($rc), everything it made is removed"; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# What a fresh Debian machine may lack, installed as .ci/run does, and only
# when missing.
missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
	echo "demo: installing ${missing[*]}"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
[ -x "$bin" ] || go build -o "$bin" ./cmd/galactic-node

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
in_ns() { ip netns exec "$ns" "$@"; }
fail() { echo "demo: $*" >&2; exit 1; }

step "a private network namespace ($ns), and in $work a private bpffs and every file the daemon writes"
ip netns add "$ns"
in_ns ip link set lo up
mkdir -p "$work/bpffs" "$work/locks"
mount -t bpf bpffs "$work/bpffs"
common=(--bpffs "$work/bpffs" --vrf-lock-dir "$work/locks")
# Every path galactic-node run writes, kept in $work: at their defaults the
# daemon would record the demo's pin layout in the host's /run/galactic,
# collect records in the host's /var/lib/cni and keep its brake in
# /var/lib/galactic (and, run outside the host's network namespace with a
# default, it refuses to start). integration/demo_test.go checks the host
# is left as it was.
private=(--layout-record "$work/datapath-layout" --cni-data-dir "$work/cni-data" --brake-memory "$work/brake.json"
	--admin-socket "$work/admin.sock")

# Names carry the identity in base62 (0-9, a-z, A-Z): the VPC is a 48-bit
# number written in 9 digits, the attachment a 16-bit one in 3.
step "three tenant taps of VPC \"a\" (10 in base62), attachments 1, 2, 3, made as CNI ADD makes them"
cat <<'TEXT'
A VPC identifier is a 48-bit number written in base62 (0-9, a-z, A-Z) and
zero-padded to 9 characters: VPC "a" is 10, written 00000000a. An attachment
is 16-bit, padded to 3: 1 is 001. A tenant tap is named G + VPC + attachment
+ H (G00000000a001H) and enslaved to its VPC's VRF, G + VPC + V
(G00000000aV). This kernel has no VRF, so a bridge of that name stands in.
TEXT
for a in 1 2 3; do
	in_ns "$bin" tap add --vpc a --attachment "$a" --owner "sandbox-$a" --master bridge --table 1010 \
		--route "10.10.0.$a/32" --gateway4 10.10.0.254 --host-port udp/53 "${common[@]}"
done
# ip netns exec execs the command, so $! is the holder itself (a shell
# function here would put a subshell in between, which kill would miss).
ip netns exec "$ns" "$bin" tap hold --vpc a --attachment 1 >"$work/holder.log" 2>&1 &
pids+=($!)
until grep -q holding "$work/holder.log" 2>/dev/null; do sleep 0.1; done
echo "made (ip -br link in the namespace):"
in_ns ip -br link show master G00000000aV | sed 's/^/  /'
in_ns ip -br link show G00000000aV | sed 's/^/  /'
in_ns ip -br link show master G00000000aV | grep -q '^G00000000a003H' || fail "the taps are not enslaved to G00000000aV"
echo "attachment 1 is held by a running process (pid ${pids[0]}), as by a VMM"

step "the inventory: a VPCAttachment carries attachment 2; nothing carries attachment 3"
cat >"$work/inventory.yaml" <<YAML
apiVersion: cloud.datumapis.com/v1alpha1
kind: VPCAttachment
metadata: {name: web-2, namespace: tenant-a}
status: {vpc: "a", vpcAttachment: "2", node: demo, hostInterface: G00000000a002H}
YAML
cat "$work/inventory.yaml"

admin_token=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
read_token=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
(umask 077 && printf 'admin %s\nread %s\n' "$admin_token" "$read_token" >"$work/tokens")

# A candidate must have been stale for --min-candidate-age (5m in
# production) before a pass may remove it; the demo waits 3 s instead.
step "galactic-node run, passes only when forced (--interval 0), candidates eligible after 3 s"
ip netns exec "$ns" "$bin" run --node-name demo --inventory-file "$work/inventory.yaml" --interval 0 --min-candidate-age 3s "${common[@]}" \
	"${private[@]}" --admin-token-file "$work/tokens" \
	--metrics-listen 127.0.0.1:9180 --log-format text >"$work/daemon.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/admin.sock" ] && break; sleep 0.1; done
[ -S "$work/admin.sock" ] || { cat "$work/daemon.log"; fail "the daemon did not start"; }

api() { # api METHOD PATH [TOKEN]: curl over the unix socket, as an operator would
	curl -sS --fail-with-body --unix-socket "$work/admin.sock" -X "$1" -H "Authorization: Bearer ${3:-$read_token}" -H 'Accept: text/plain' "http://node$2"
}
json() { curl -sS --unix-socket "$work/admin.sock" -H "Authorization: Bearer $read_token" "http://node$1"; }
stale_ifindex=$(in_ns cat /sys/class/net/G00000000a003H/ifindex)

step "curl --unix-socket $work/admin.sock http://node/v1/taps"
api GET /v1/taps
step "the stale tap's eBPF rows: GET /v1/ebpf/interfaces/$stale_ifindex"
api GET "/v1/ebpf/interfaces/$stale_ifindex"

step "pass 1 (POST /v1/passes with the admin token): the stale tap becomes a candidate"
api POST /v1/passes "$admin_token" >/dev/null
api GET /v1/taps/pending
[[ "$(json /v1/taps/pending)" == *G00000000a003H* ]] || fail "the stale tap is not pending after pass 1"
in_ns test -e /sys/class/net/G00000000a003H || fail "pass 1 removed the stale tap"

step "pass 2 at once: too young to confirm, kept"
api POST /v1/passes "$admin_token" >/dev/null
in_ns test -e /sys/class/net/G00000000a003H || fail "a pass before the candidate's eligibleAt removed it"

step "pass 3, once eligible (3 s after pass 1): confirmed and reclaimed"
sleep 3
api POST /v1/passes "$admin_token" >/dev/null
api GET /v1/passes
api GET /v1/taps
in_ns test ! -e /sys/class/net/G00000000a003H || fail "pass 3 did not reclaim the stale tap"
in_ns test -e /sys/class/net/G00000000a001H || fail "the held tap was removed"
in_ns test -e /sys/class/net/G00000000a002H || fail "the live tap was removed"

status() { # status WANT WHAT CURL-ARGS...: prints the code, fails the demo on another
	local want=$1 what=$2 got
	shift 2
	got=$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$work/admin.sock" "$@")
	printf '  %s  %s\n' "$got" "$what"
	[ "$got" = "$want" ] || fail "$what: HTTP $got, want $want"
}

step "its eBPF rows are gone: no program on interface $stale_ifindex and no row of it, so the admin API knows it not (404)"
status 404 "GET /v1/ebpf/interfaces/$stale_ifindex" "http://node/v1/ebpf/interfaces/$stale_ifindex"

step "a read token cannot force a pass (403), an unknown token is refused (401), and with no token the caller's uid decides: root is admin (200)"
status 403 "POST /v1/passes with the read token" -X POST -H "Authorization: Bearer $read_token" http://node/v1/passes
status 401 "GET /v1/taps with an unknown token" -H "Authorization: Bearer not-a-token" http://node/v1/taps
status 200 "GET /v1/taps as root with no token" http://node/v1/taps

step "metrics (curl 127.0.0.1:9180/metrics inside the namespace)"
# Fetched once into a file: piping curl into grep -q can cut curl off
# mid-body (SIGPIPE), which pipefail reports as a failure.
in_ns curl -sS --retry 3 --retry-all-errors -o "$work/metrics.txt" 127.0.0.1:9180/metrics || fail "metrics unreachable"
grep -E '^galactic_cni_stale_(taps_pending|taps_reclaimed_total|tap_reclaim_failures_total|tap_passes_total)' "$work/metrics.txt"
grep -q '^galactic_cni_stale_taps_reclaimed_total 1$' "$work/metrics.txt" || fail "reclaimed_total is not 1"

step "the daemon's log"
grep -E 'stale tap|pass forced' "$work/daemon.log" | sed 's/^/  /' || true

# The same API without curl or a token: the daemon's client subcommands
# read the caller's uid from the socket, and root is admin. On a node the
# socket is at its default, /run/galactic/admin.sock, and --socket is not
# needed.
step "the same, with galactic-node's client subcommands (as root, no token)"
cli() {
	printf '\n$ galactic-node %s --socket %s\n' "$*" "$work/admin.sock"
	"$bin" "$@" --socket "$work/admin.sock"
}
printf '  %-36s replaces  %s\n' \
	"galactic-node taps" "curl --unix-socket SOCK -H \"Authorization: Bearer \$READ_TOKEN\" -H 'Accept: text/plain' http://node/v1/taps" \
	"galactic-node pending" "curl ... http://node/v1/taps/pending" \
	"galactic-node passes" "curl ... http://node/v1/passes" \
	"galactic-node pass [--dry-run]" "curl ... -X POST -H \"Authorization: Bearer \$ADMIN_TOKEN\" http://node/v1/passes" \
	"galactic-node rows IFINDEX" "curl ... http://node/v1/ebpf/interfaces/IFINDEX" \
	"galactic-node status" "curl ... http://node/v1/status"
printf '\n$ curl --unix-socket %s -H "Authorization: Bearer $READ_TOKEN" -H '"'"'Accept: text/plain'"'"' http://node/v1/taps\n' "$work/admin.sock"
api GET /v1/taps
cli taps
cli status
cli pass --dry-run
