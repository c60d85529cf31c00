#!/usr/bin/env bash
# make bench: runs every benchmark (as root: they use real taps, eBPF and a
# real API server) and writes bench/RESULTS.md with the machine and date.
# Figures are ratios against peers measured in the same run, since these
# machines are shared and noisy.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
KUBEBUILDER_ASSETS=$(hack/testbin.sh)
export KUBEBUILDER_ASSETS
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT

run() { # run PKG REGEX BENCHTIME [COUNT]
	echo "bench $1 $2" >&2
	go test -run='^$' -bench="$2" -benchtime="$3" -count="${4:-1}" -timeout 60m "$1" | tee -a "$raw" >&2
}

# median folds the lines of a benchmark run COUNT times into one: each
# figure the median of its runs (the middle one, COUNT odd), so one run's
# burst of load on this shared machine moves no figure. A ratio is the
# median of the runs' ratios, each of two sides measured in the same run,
# not a ratio of medians from different runs. Benchmarks keep their order.
median() {
	awk '{
		if (!($1 in runs)) order[++n] = $1
		runs[$1]++; iters[$1] = $2
		for (i = 3; i < NF; i += 2) {
			k = $1 SUBSEP $(i + 1)
			if (!(k in cnt)) units[$1] = units[$1] " " $(i + 1)
			v[k, ++cnt[k]] = $i
		}
	}
	END {
		for (j = 1; j <= n; j++) {
			name = order[j]; line = name " " iters[name]
			m = split(units[name], u, " ")
			for (x = 1; x <= m; x++) {
				k = name SUBSEP u[x]; c = cnt[k]
				for (a = 1; a <= c; a++) s[a] = v[k, a]
				for (a = 2; a <= c; a++) # insertion sort, by value
					for (b = a; b > 1 && s[b - 1] + 0 > s[b] + 0; b--) { t = s[b]; s[b] = s[b - 1]; s[b - 1] = t }
				line = line " " s[int((c + 1) / 2)] " " u[x]
			}
			print line (runs[name] > 1 ? " " runs[name] " runs" : "")
		}
	}'
}

run ./node/link 'Dump1000Taps$' 10x
run ./node/tun/holder 'ProbeWindow' 200x
run ./ebpf/datapath 'Dump16384Rows' 10x
run ./ebpf/datapath 'TapIngress' 200x
run ./ebpf/datapath 'DropMonitor|RouteLookupWithoutTheDaemon' 100x
run ./node/routewatch 'RouteChangeToHostView' 2000x
run ./node/attachreg 'OrphanScan16384Rows' 10x
run ./node/reclaim 'PassWithNoRemovals' 5x
run ./node/reclaim 'Remove1000ConfirmedTaps' 2x
run ./node/reclaim 'APIRequestsPerSteadyStatePass' 20x
run ./node/reclaim 'RemovingPassProof' 5x
# One process for the three, so the 100,000 VPCAttachments (minutes to
# create) are created once.
run ./node/reclaim 'PassWith100000ClusterObjects|RemovingPassAt100000Attachments|ClusterInventoryHeapWith100000Objects|CandidatesRemovingPass' 1x
run ./node/inventory 'FileInventory100000Identities' 5x
run ./admin 'PendingWithAuthAt64Clients' 3x
run ./hubctl 'Release1000ClaimsOfGoneNetworks' 1x
run ./node/nodeevents 'EventWritesPer1000Removals' 3x
run ./hubctl 'ChurnSettles' 1x
run ./hubctl 'CreateToIdentity' 100x
run ./hubctl 'FreedUnitToIdentity' 20x
run ./integration 'DaemonRSS' 3x
# Anchored: 'LibcniAddDel' alone would also run LibcniAddDelAt. Three runs
# each, their figures the median (median, below).
run ./integration 'LibcniAddDel$' 30x 3
# Issue 27's scale points; each run sets up its 1,000 attachments a side
# (about a minute), untimed.
run ./integration 'LibcniAddDelAt' 30x 3
# Where a verb's milliseconds go: needs perf (linux-perf); skipped without.
run ./integration 'CNIVerbPhases' 20x
run ./integration 'LibcniGCWith1000ValidAttachments' 20x
run ./integration 'KernelMemoryPerTap' 1x
run ./integration 'AddStorm200' 1x
# The fleet simulation's small sizes (10 and 50 nodes, 10,000 objects);
# make bench-fleet runs the large ones into bench/FLEET.md.
GALACTICTEST_FLEET_SIZES=10x10000,50x10000 run ./bench/fleet 'Fleet' 1x

{
	echo "# Benchmark results"
	echo
	echo "Written by \`make bench\` on $(date -u +%Y-%m-%dT%H:%MZ)."
	echo
	echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), $(go version | cut -d' ' -f3)."
	echo "Shared and noisy: compare the ratios (x-of-…) across runs, not the absolute times."
	echo
	echo "| benchmark | iterations | figures |"
	echo "|---|---|---|"
	grep -E '^Benchmark' "$raw" | median | while read -r name iters rest; do
		figs=$(echo "$rest" | awk '{ out=""; for (i = 1; i < NF; i += 2) { v=$i; if (v+0 >= 1e6) v=sprintf("%.3g", v); out = out (out=="" ? "" : ", ") v " " $(i+1) } print out }')
		echo "| ${name%-*} | $iters | $figs |"
	done
	echo
	echo "Peers: rawdump = one RTM_GETLINK dump with stats skipped and no parsing; linklist = rtnetlink v2"
	echo "Link.List; ip = \`ip -d -o link show\`; ip-batch = \`ip -batch\` deleting one by one; ip-group ="
	echo "\`ip link del group\`; bpftool = \`bpftool map dump pinned\`; bare = a bare net/http handler, or"
	echo "bare client-go deletes for hubctl. The inventory figure is the file source, which caches the"
	echo "same trimmed objects as the informers; API requests per pass are counted against a real API server."
	echo "unproved = the same removing pass over the same informers without the consistent read of the API"
	echo "server (1,000 VPCAttachments) that must precede every removal. batch-dump = one batch dump of every"
	echo "per-interface map, the peer of the orphan scan (16,384 ifindex_vrf rows, 1% orphans). bridge = the"
	echo "reference bridge+host-local conflist (containernetworking/plugins v1.10.0) through libcni, same run:"
	echo "built static, as upstream ships it, and stripped, as the image ships galactic-tap; each side warmed"
	echo "with one untimed ADD and DEL first (galactic's first ADD has the kernel verify its eBPF program); both"
	echo "stores (galactic's records, host-local's reservations) on one filesystem; the sides' order alternating"
	echo "each iteration. …-cpu-ns = the plugin processes' user+sys per verb (RUSAGE_CHILDREN), beside the wall"
	echo "time (…-ns); busy-% = the share of all CPUs' time spent busy during the timed loop (the verbs"
	echo "included), load1-start, load1-end = the 1-minute load average at each end (it lags), cpus the"
	echo "machine's. first-add-ns = the first ADD over fresh pins, as after an upgrade (it verifies the program)."
	echo "A row ending in N runs: each figure is the median of N runs of the benchmark (-count 3)."
	echo "existing=N: ADD and DEL of one more attachment with N of the same network already there (over 1,000: in"
	echo "five VPCs and five bridges, as a bridge takes at most 1,024 ports), each side"
	echo "in a host namespace of its own, every bridge pod in a netns of its own. bridge's GC is a no-op in"
	echo "v1.10.0 (it registers none), so bridge-gc-ns is libcni's pass over its 1,000 cached results plus one"
	echo "exec; hostlocal = the same GC through libcni to host-local alone, which reads its 1,000 reservations."
	echo "AddStorm200: 200 ADDs of the built plugin into one VPC, each its own process, all started at once,"
	echo "against the same 200 run one by one in the same run: wall time, the longest single ADD, and the"
	echo "plugins' CPU (user+sys) per ADD. KernelMemoryPerTap: unreclaimable slab per plugin-made tap (1,000"
	echo "single-queue, 200 multiqueue) against 1,000 veth pairs on a bridge."
	echo "static = the same pass over 10,000 taps with an inventory.Static of the same 100,000 objects;"
	echo "prebuilt = with a snapshot built in advance (no inventory cost); heap-MiB = live heap of a cluster"
	echo "inventory synced over 100,000 VPCAttachments of a real API server."
	echo "RemovingPassAt100000Attachments: the pass that removes 1 stale tap (of 101 stamped) over 100,000"
	echo "VPCAttachments; proof = its consistent read of both resources, timed alone after it (5,000 a page);"
	echo "sync = the informers' initial list until synced; clientgo-list = client-go's paginated consistent"
	echo "list of the same objects (5,000 a page), the peer; pass-alloc = bytes allocated by the pass; rss = the"
	echo "benchmark process's resident set (informers, the shared cluster's client, the set-up's objects)."
	echo "CandidatesRemovingPass: the candidates inventory's pass that removes k stale taps (the node's only"
	echo "ones), at 1,000 and then 100,000 VPCAttachments, in one run: api-requests and api-bytes as the node's"
	echo "transport counted them (goal: <= 3k+2 requests, <= 64 KiB a candidate, x-of-1000-objects <= 1.2);"
	echo "informer-proof = the informers' removing pass's consistent read of everything, clientgo-list ="
	echo "client-go's paginated list, both peers timed in the same loop; steady = a pass with no tap (goal 0);"
	echo "heap-growth = this process's heap after GC, over the loop (goal: <= 5 MiB at 100,000); api-cpu-ms ="
	echo "the API server's CPU over the pass (and over the informers' proof), its idle included."
	echo "TapIngress: per frame written into a tap (tap/…, net of the bare tap, writer on one CPU) or per"
	echo "BPF_PROG_TEST_RUN (test-run/…): after = this build's program, with the route watcher's host view;"
	echo "before = the program before issue 21 on the same maps; nft = the same rules in an nftables netdev"
	echo "ingress chain on the tap (both shown to enforce them first). Goals: x-of-before <= 1.3, x-of-nft <= 0.5."
	echo "DropMonitor: tap/allowed = an allowed frame's cost over the bare tap, this build (monitor, a reader draining"
	echo "the ring) against the same source built without the monitor (none), goal x-of-none <= 1.05; tap/spoofed = a"
	echo "dropped frame's whole write, its tap's record budget spent; flood = records/s one tap's flood yields (budget 32)"
	echo "and the monitor's maps (ring, budgets, lost counters). RouteLookupWithoutTheDaemon: BPF_PROG_TEST_RUN of a"
	echo "frame to a host address with the daemon's view trusted (cached answers) and lapsed (a fresh lookup a frame)."
	echo "RouteChangeToHostView: an address change returning to its caller, to the watcher's host view holding it."
	echo "Release1000ClaimsOfGoneNetworks: the claims of 1,000 gone networks released by the startup sweep (sweep:"
	echo "one LIST of networks, a delete per claim) or by the workers (workers: batched LISTs confirming the networks"
	echo "gone, a delete per claim), the controller's informers holding the claims and allocations, against 1,000"
	echo "bare client-go deletes, both at the hub's default client rate (50/s, burst 100); requests/release = every"
	echo "HTTP request of the controller's clients in the window but Event writes, per claim. Goals: x-of-bare-delete <= 1.2,"
	echo "requests/release <= 1.2 (docs/hub.md); ipam/…: the same through the ipam-shaped service (test/framework/ipamtest), whose"
	echo "deletes ignore preconditions and answer the claim deleted, which the release checks; goal requests/release <= 1.10;"
	echo "placed/sweep: each gone network also has its placement policy, deleted between the identity and the claim"
	echo "(docs/hub.md, \"Placement\"), against bare deletes of both; requests/release is then per collected network, goal"
	echo "one request more than sweep's (the policy's DELETE)."
	echo "event-writes/release: the ClaimReleased Events the hub writes in the background, one per release, counted"
	echo "apart from requests/release (which they would otherwise double). EventWritesPer1000Removals (node/nodeevents):"
	echo "the node's Event writes (creates and series patches) for 1,000 TapReclaimed over 100 passes at the default cap,"
	echo "beside one tap whose removal fails in each pass and ten brake engagements and releases, counted as the API"
	echo "server receives them; the peer is the removals themselves (goal: one write each, repeats folded into series)."
	echo "Hub failover is measured by integration tests: bench/FAILOVER.md."
	echo "CNIVerbPhases: one ADD and one DEL of the built plugin cut into phases at their system calls, traced by"
	echo "\`perf trace\` (median of the verbs, ms): start (exec, Go runtime, package init), parse, open (the pins), lock,"
	echo "tap, rows (eBPF rows, TCX attach; DEL: clearing them), record, find (DEL: lock, records, the tap read and"
	echo "probed), dellink (the kernel's RTM_DELLINK), exit; docs/datapath.md, \"Where a CNI verb's milliseconds go\"."
	echo "Fleet: N simulated nodes' informers against one API server (bench/fleet; bench/FLEET.md has the"
	echo "large sizes and what each figure is, docs/scale.md the model built on them)."
} > bench/RESULTS.md
echo "wrote bench/RESULTS.md" >&2
