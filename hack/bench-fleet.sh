#!/usr/bin/env bash
# make bench-fleet: the fleet simulation (bench/fleet) at its large sizes, one
# `go test` process per size, each bounded in time, and writes bench/FLEET.md
# with the machine and date. A size that fails (out of time or memory) is
# written down as such; the sizes after it still run. `make bench` runs the
# small sizes (10 and 50 nodes, 10,000 objects) with the other benchmarks.
#
# GALACTICTEST_FLEET_SIZES: the sizes, NODESxOBJECTS, comma-separated. The
# default stops at 50 x 100,000 (about 11 minutes on 2 cores): 200 x 100,000
# needs about 26 minutes of sync alone there (bench/FLEET.md); give it on a
# machine with more cores.
# GALACTICTEST_FLEET_TIMEOUT: the bound on one size (15m).
# GALACTICTEST_FLEET_MODES: the inventory modes' runs (BenchmarkFleetModes),
# MODE:NODESxOBJECTS, comma-separated (candidates:1000x100000,
# informers:50x100000), each also bounded by the timeout; a run that fails
# is written down with the phases it measured before.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
KUBEBUILDER_ASSETS=$(hack/testbin.sh)
export KUBEBUILDER_ASSETS
sizes=${GALACTICTEST_FLEET_SIZES:-200x10000,50x100000}
limit=${GALACTICTEST_FLEET_TIMEOUT:-15m}
out=${GALACTICTEST_FLEET_OUT:-bench/FLEET.md}
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
go test -c -o "$raw.bin" ./bench/fleet
trap 'rm -f "$raw" "$raw.bin"' EXIT

IFS=, read -ra list <<<"$sizes"
for s in "${list[@]}"; do
	echo "bench-fleet $s" >&2
	log=$(mktemp)
	start=$(date +%s)
	set +e
	GALACTICTEST_FLEET_SIZES=$s timeout --kill-after=30s "$limit" "$raw.bin" -test.run='^$' -test.bench=Fleet -test.benchtime=1x -test.timeout=0 >"$log" 2>&1
	rc=$?
	set -e
	cat "$log" >&2
	if grep -qE '^BenchmarkFleet' "$log"; then
		grep -E '^BenchmarkFleet' "$log" >>"$raw"
	else
		why="exit $rc"
		[ "$rc" = 124 ] || [ "$rc" = 137 ] && why="not done within $limit (exit $rc)"
		reason=$(grep -m1 -E 'fleet_test.go:|fatal error|out of memory|signal: killed|panic:' "$log" | sed 's/^ *//' || true)
		echo "FAILED $s $why after $(( $(date +%s) - start )) s${reason:+: $reason}" >>"$raw"
	fi
	rm -f "$log"
done

# The inventory modes (BenchmarkFleetModes), one process each.
modes=${GALACTICTEST_FLEET_MODES:-candidates:1000x100000,informers:50x100000}
rawm=$(mktemp)
trap 'rm -f "$raw" "$raw.bin" "$rawm"' EXIT
IFS=, read -ra mlist <<<"$modes"
for s in "${mlist[@]}"; do
	echo "bench-fleet modes $s" >&2
	log=$(mktemp)
	start=$(date +%s)
	set +e
	GALACTICTEST_FLEET_MODES=$s GALACTICTEST_FLEET_PROBE=${GALACTICTEST_FLEET_PROBE:-75s} timeout --kill-after=30s "$limit" "$raw.bin" -test.run='^$' -test.bench=FleetModes -test.benchtime=1x -test.timeout=0 -test.v >"$log" 2>&1
	rc=$?
	set -e
	grep -vE '^\{' "$log" >&2
	if grep -qE '^BenchmarkFleetModes/' "$log" && grep -qE '^BenchmarkFleetModes/.*ns/op' "$log"; then
		grep -E '^BenchmarkFleetModes/.*ns/op' "$log" >>"$rawm"
	else
		why="exit $rc"
		[ "$rc" = 124 ] || [ "$rc" = 137 ] && why="not done within $limit (exit $rc)"
		done=$(grep -E 'modes_test.go:[0-9]+: (start|idle|restart|mass):' "$log" | sed -E 's/^ *modes_test.go:[0-9]+: //' | paste -sd ';' - || true)
		reason=$(grep -m1 -E 'modes_test.go:[0-9]+: [^sirmp]|fatal error|out of memory|signal: killed|panic:' "$log" | sed 's/^ *//' || true)
		echo "FAILED $s $why after $(( $(date +%s) - start )) s${reason:+: $reason}${done:+; measured before: $done}" >>"$rawm"
	fi
	rm -f "$log"
done

# fig LINE UNIT: the figure of a benchmark line reported in UNIT.
fig() { echo "$1" | awk -v u="$2" '{ for (i = 3; i < NF; i++) if ($(i+1) == u) { printf "%.4g", $i; exit } print "-" }'; }

{
	echo "# Fleet simulation"
	echo
	echo "Written by \`make bench-fleet\` (hack/bench-fleet.sh, bench/fleet) on $(date -u +%Y-%m-%dT%H:%MZ)."
	echo
	echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), $(go version | cut -d' ' -f3)."
	echo "Shared and noisy; the API server, etcd and every simulated node share its cores."
	echo
	echo "N simulated nodes, each the daemon's informer source (kubeinventory.NewCluster) on a client and"
	echo "TCP connection of its own, against one kube-apiserver and etcd holding M objects (70% VPCAttachments,"
	echo "30% BGPAdvertisements). Nodes start 10 at a time. RSS is VmRSS once every node has synced and 15 s"
	echo "have passed; peak is the API server's VmHWM. Per node = this process's heap growth after GC / N."
	echo "delete/create = from the start of the write until the last node's Snapshot agrees (upper bound:"
	echo "Snapshots are polled round-robin, one sweep of all N is the resolution); wire = until the watch"
	echo "event reached the last node's connection. p50/p99 over 100 probes, written one every 20 ms."
	echo
	echo "| N | M | apiserver RSS MiB (peak) | apiserver CPU s, N initial lists | apiserver idle CPU % | etcd RSS MiB | per node MiB | all synced s | delete→gone p50/p99 ms | wire | create→carried p50/p99 ms | wire | sweep ms | conns |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	while read -r line; do
		case $line in
		FAILED*)
			set -- $line
			echo "| ${2%x*} | ${2#*x} | ${line#FAILED $2 } |||||||||||"
			;;
		*)
			n=$(echo "$line" | sed -E 's/.*nodes=([0-9]+).*/\1/'); m=$(echo "$line" | sed -E 's/.*objects=([0-9]+).*/\1/')
			echo "| $n | $m | $(fig "$line" api-rss-MiB) ($(fig "$line" api-peak-rss-MiB)) | $(fig "$line" api-sync-cpu-s) | $(fig "$line" api-idle-cpu-%) | $(fig "$line" etcd-rss-MiB) | $(fig "$line" node-heap-MiB) | $(fig "$line" sync-s) | $(fig "$line" delete-p50-ms) / $(fig "$line" delete-p99-ms) | $(fig "$line" delete-wire-p50-ms) / $(fig "$line" delete-wire-p99-ms) | $(fig "$line" create-p50-ms) / $(fig "$line" create-p99-ms) | $(fig "$line" create-wire-p50-ms) / $(fig "$line" create-wire-p99-ms) | $(fig "$line" delete-sweep-ms) | $(fig "$line" api-conns) |"
			;;
		esac
	done <"$raw"
	echo
	echo "Raw lines:"
	echo
	echo '```'
	cat "$raw"
	echo '```'
	echo
	echo "## Inventory modes"
	echo
	echo "BenchmarkFleetModes: N nodes of one --inventory mode (informers: kubeinventory.NewCluster; candidates:"
	echo "kubeinventory.NewCandidates) against one API server holding M objects, each node probing every"
	echo "${GALACTICTEST_FLEET_PROBE:-75s} (the daemon's default, a quarter of --inventory-max-age). start = every node"
	echo "started (10 at a time) until ready; restart = the API server stopped and started, until every node is"
	echo "back (the informers relisted, the candidates' next read done); mass = every node makes its removing"
	echo "pass's read for one stale tap (the informers' consistent read of everything, the candidates' ask),"
	echo "all starting within a minute, once the watch caches the restart emptied are ready (caches s after the"
	echo "API server started). CPU = the API server's utime+stime over the phase, and (net) less its baseline"
	echo "with no node times the phase's length; read = the bytes of the answers the nodes read; s = until the"
	echo "last node was done. Per node: divided by N."
	echo
	echo "| mode | N | M | start CPU-s/node (net) | start KiB/node | start s | restart CPU-s/node (net) | restart KiB/node | restart s | caches s | mass CPU-s/node (net) | mass KiB/node | mass s | idle CPU % (baseline) |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	while read -r line; do
		case $line in
		FAILED*)
			echo "| ${line} |||||||||||||"
			;;
		*)
			mode=$(echo "$line" | sed -E 's/.*mode=([a-z]+).*/\1/'); n=$(echo "$line" | sed -E 's/.*nodes=([0-9]+).*/\1/'); m=$(echo "$line" | sed -E 's/.*objects=([0-9]+).*/\1/')
			echo "| $mode | $n | $m | $(fig "$line" start-api-cpu-s/node) ($(fig "$line" start-net-api-cpu-s/node)) | $(fig "$line" start-KiB/node) | $(fig "$line" start-s) | $(fig "$line" restart-api-cpu-s/node) ($(fig "$line" restart-net-api-cpu-s/node)) | $(fig "$line" restart-KiB/node) | $(fig "$line" restart-s) | $(fig "$line" caches-ready-s) | $(fig "$line" mass-api-cpu-s/node) ($(fig "$line" mass-net-api-cpu-s/node)) | $(fig "$line" mass-KiB/node) | $(fig "$line" mass-s) | $(fig "$line" idle-api-cpu-%) ($(fig "$line" baseline-api-cpu-%)) |"
			;;
		esac
	done <"$rawm"
	echo
	echo '```'
	cat "$rawm"
	echo '```'
} >"$out"
echo "wrote $out" >&2
