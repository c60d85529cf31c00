package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// Issue 27's scale points: the CNI verbs with many attachments already on
// the node, each against the reference bridge+host-local network measured
// in the same run. Both sides are driven through libcni from their host
// namespace, as containerd's go-cni does.
//
// Each side has a host namespace and a libcni result cache of its own, as
// if it were the node's only network: what is timed on one side meets only
// its own existing attachments (links, routes, records, cached results),
// never the other side's.

// quietRuntime is newRuntime with the plugins' logs discarded: thousands
// of ADDs would bury a benchmark's output in them. A failing verb's error
// still says what went wrong (the plugin's error result, through libcni).
func quietRuntime(tb testing.TB, h *cniHost) *runtime {
	tb.Helper()
	r := newRuntime(tb, h)
	r.cni = libcni.NewCNIConfigWithCacheDir(r.cni.Path, r.cache, &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: io.Discard}})
	return r
}

// benchAttachment is the galactic attachment the timed ADD and DEL make and
// remove: the same identity at every scale, above the existing ones.
const benchAttachment = 50000

// galacticAt makes n attachments of the galactic network (identities 1..n,
// one container each) through libcni, untimed and several at once, after
// one ADD and DEL of benchAttachment so the network's master exists even
// at n = 0. It returns them as a runtime lists them in a GC.
func galacticAt(tb testing.TB, r *runtime, n int) []types.GCAttachment {
	tb.Helper()
	warm := r.rt(fmt.Sprintf("c%063x", 0), "eth0")
	err := r.in(func(ctx context.Context) error {
		l := r.list("1.1.0", "galactic", identity.Attachment(benchAttachment).Base62())
		if _, err := r.cni.AddNetworkList(ctx, l, warm); err != nil {
			return err
		}
		return r.cni.DelNetworkList(ctx, l, warm)
	})
	if err != nil {
		tb.Fatal(err)
	}
	lists := make([]*libcni.NetworkConfigList, n)
	valid := make([]types.GCAttachment, n)
	for i := range n {
		vpc, table := benchVPC(i)
		lists[i] = r.listConf("1.1.0", "galactic", identity.Attachment(i+1).Base62(), map[string]any{"vpc": vpc, "table": table})
		valid[i] = types.GCAttachment{ContainerID: fmt.Sprintf("e%063x", i), IfName: "eth0"}
	}
	inParallel(tb, n, func(i int) error {
		return r.in(func(ctx context.Context) error {
			_, err := r.cni.AddNetworkList(ctx, lists[i], r.rt(valid[i].ContainerID, valid[i].IfName))
			return err
		})
	})
	return valid
}

// perMaster is how many existing attachments share one master on either
// side: the bridge that stands in for the VRF (this kernel has none) takes
// at most 1,024 ports (BR_MAX_PORTS; the next enslave fails with EXFULL),
// so beyond it the attachments spread over more VPCs, one bridge each, as
// the peer's pods spread over more bridges. The timed attachment is always
// in the first, with 1,000 others at most.
const perMaster = 1000

// benchVPC is the VPC, and its table, of existing galactic attachment i.
func benchVPC(i int) (string, int) {
	g := i / perMaster
	return string(rune('a' + g)), 1010 + g
}

// requireGalacticTaps fails tb unless the taps of identities 1..n all exist.
func requireGalacticTaps(tb testing.TB, h *cniHost, n int) {
	tb.Helper()
	links, err := h.host.Dial(tb).Links(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	have := make(map[string]bool, len(links))
	for _, l := range links {
		have[l.Name] = true
	}
	for i := range n {
		vpc, _ := benchVPC(i)
		id, err := identity.ParseBase62(vpc, identity.Attachment(i+1).Base62())
		if err != nil {
			tb.Fatal(err)
		}
		if name := id.TapName(); !have[name] {
			tb.Fatalf("tap %s of existing attachment %d is gone", name, i+1)
		}
	}
}

// bridgePeer is the reference network: the bridge plugin with host-local
// addresses (a /16), alone in a host namespace of its own. Each attachment
// is a pod with a network namespace of its own, as a runtime makes one
// per pod sandbox: its eth0 is a veth pair whose host end is on cnibr0.
type bridgePeer struct {
	r        *runtime
	list     *libcni.NetworkConfigList // bridge, delegating to host-local
	ipamOnly *libcni.NetworkConfigList // host-local alone: the same network's store
	// more are the networks of the pods beyond the first perMaster, each
	// on a bridge and in a subnet of its own.
	more []*libcni.NetworkConfigList
	ipam string   // host-local's data dir
	pods []string // the pods' namespaces, by path
}

func newBridgePeer(tb testing.TB, pods int) *bridgePeer {
	tb.Helper()
	r := quietRuntime(tb, &cniHost{t: tb, host: nettest.NewNS(tb)})
	ipam := filepath.Join(tb.TempDir(), "host-local")
	ipamConf := map[string]any{"type": "host-local", "subnet": "10.99.0.0/16", "dataDir": ipam}
	p := &bridgePeer{r: r, ipam: ipam, pods: podNamespaces(tb, pods),
		list:     benchConfList(tb, "peer", map[string]any{"type": "bridge", "bridge": "cnibr0", "isGateway": true, "ipam": ipamConf}),
		ipamOnly: benchConfList(tb, "peer", map[string]any{"type": "host-local", "ipam": ipamConf})}
	for g := 1; g*perMaster < pods-1; g++ {
		p.more = append(p.more, benchConfList(tb, fmt.Sprintf("peer-%d", g), map[string]any{
			"type": "bridge", "bridge": fmt.Sprintf("cnibr%d", g), "isGateway": true,
			"ipam": map[string]any{"type": "host-local", "subnet": fmt.Sprintf("10.%d.0.0/16", 99+g), "dataDir": ipam}}))
	}
	return p
}

// listOf is the network of existing pod i.
func (p *bridgePeer) listOf(i int) *libcni.NetworkConfigList {
	if g := i / perMaster; g > 0 {
		return p.more[g-1]
	}
	return p.list
}

func benchConfList(tb testing.TB, name string, plugin map[string]any) *libcni.NetworkConfigList {
	tb.Helper()
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": []any{plugin}})
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

func (p *bridgePeer) rt(container, pod string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: container, NetNS: pod, IfName: "eth0"}
}

// at makes n attachments, one in each of the first n pods, untimed and
// several at once, after one ADD and DEL in the last pod so the bridge
// exists even at n = 0. It returns them as a runtime lists them in a GC.
func (p *bridgePeer) at(tb testing.TB, n int) []types.GCAttachment {
	tb.Helper()
	warm := p.rt(fmt.Sprintf("d%063x", 0), p.pods[len(p.pods)-1])
	err := p.r.in(func(ctx context.Context) error {
		if _, err := p.r.cni.AddNetworkList(ctx, p.list, warm); err != nil {
			return err
		}
		return p.r.cni.DelNetworkList(ctx, p.list, warm)
	})
	if err != nil {
		tb.Fatal(err)
	}
	valid := make([]types.GCAttachment, n)
	for i := range n {
		valid[i] = types.GCAttachment{ContainerID: fmt.Sprintf("f%063x", i), IfName: "eth0"}
	}
	inParallel(tb, n, func(i int) error {
		return p.r.in(func(ctx context.Context) error {
			_, err := p.r.cni.AddNetworkList(ctx, p.listOf(i), p.rt(valid[i].ContainerID, p.pods[i]))
			return err
		})
	})
	return valid
}

// reservations counts host-local's address reservations, in every
// network of the peer.
func (p *bridgePeer) reservations(tb testing.TB) int {
	tb.Helper()
	n := 0
	for _, l := range append([]*libcni.NetworkConfigList{p.list}, p.more...) {
		entries, err := os.ReadDir(filepath.Join(p.ipam, l.Name))
		if err != nil {
			tb.Fatal(err)
		}
		for _, e := range entries {
			if e.Type().IsRegular() && e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip.") {
				n++
			}
		}
	}
	return n
}

// podNamespaces makes n named network namespaces with one ip -batch, and
// removes them when tb ends (their veth pairs go with them).
func podNamespaces(tb testing.TB, n int) []string {
	tb.Helper()
	nettest.RequirePrivileged(tb)
	var r [4]byte
	_, _ = rand.Read(r[:])
	prefix := "galactic-pod-" + hex.EncodeToString(r[:]) + "-"
	var add, del strings.Builder
	paths := make([]string, n)
	for i := range n {
		fmt.Fprintf(&add, "netns add %s%d\n", prefix, i)
		fmt.Fprintf(&del, "netns del %s%d\n", prefix, i)
		paths[i] = fmt.Sprintf("/run/netns/%s%d", prefix, i)
	}
	tb.Cleanup(func() {
		cmd := exec.Command("ip", "-force", "-batch", "-")
		cmd.Stdin = strings.NewReader(del.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Errorf("remove the pods' namespaces: %v: %.300s", err, out)
		}
	})
	cmd := exec.Command("ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(add.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("make the pods' namespaces: %v: %.300s", err, out)
	}
	return paths
}

// inParallel runs fn for 0..n-1 on a few goroutines, as a node starting
// many pods at once does, and fails tb with the first error.
func inParallel(tb testing.TB, n int, fn func(i int) error) {
	tb.Helper()
	const workers = 8
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		mu    sync.Mutex
		first error
	)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("attachment %d: %w", i, err)
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		tb.Fatal(first)
	}
}

// verbCost is what verbs took: wall time, and the CPU time (user+sys) of
// the plugin processes libcni ran for them.
type verbCost struct{ wall, cpu time.Duration }

// benchTimer adds the cost of verbs run in a runtime's host namespace to c.
// The CPU time is the growth of RUSAGE_CHILDREN across the verb: libcni
// execs each plugin as a child of this process, and exec.Cmd.Wait reaps it
// before the verb returns, its own reaped children (bridge's host-local)
// counted in its usage. RUSAGE_CHILDREN counts every child this process
// has reaped, so nothing else may reap one while a timed verb runs: the
// benchmarks run one verb at a time, and start no other process meanwhile.
func benchTimer(tb testing.TB) func(r *runtime, c *verbCost, fn func(ctx context.Context) error) {
	return func(r *runtime, c *verbCost, fn func(ctx context.Context) error) {
		cpu := childrenCPU(tb)
		start := time.Now()
		if err := r.in(fn); err != nil {
			tb.Fatal(err)
		}
		c.wall += time.Since(start)
		c.cpu += childrenCPU(tb) - cpu
	}
}

// childrenCPU is the user+sys time of this process's reaped children.
func childrenCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		tb.Fatalf("getrusage of the children: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// load1 is the 1-minute load average: how busy the shared machine was.
func load1(tb testing.TB) float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		tb.Fatalf("/proc/loadavg: %q", b)
	}
	l, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		tb.Fatalf("/proc/loadavg: %v", err)
	}
	return l
}

// cpuTicks reads the machine's CPU time from /proc/stat: busy (user,
// nice, system, irq, softirq, steal) and in all, in clock ticks.
func cpuTicks(tb testing.TB) (busy, all uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		tb.Fatalf("/proc/stat: %q", line)
	}
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			tb.Fatalf("/proc/stat: %v", err)
		}
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, all
}

// sameFilesystem fails tb unless every path is on one filesystem.
func sameFilesystem(tb testing.TB, paths ...string) {
	tb.Helper()
	var first syscall.Stat_t
	for i, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			tb.Fatalf("stat %s: %v", p, err)
		}
		if i == 0 {
			first = st
		} else if st.Dev != first.Dev {
			tb.Fatalf("%s (device %d) and %s (device %d) are on different filesystems", paths[0], first.Dev, p, st.Dev)
		}
	}
}

// addDelSide is one side of an ADD/DEL benchmark.
type addDelSide struct {
	r     *runtime
	list  *libcni.NetworkConfigList
	rt    func(i int) *libcni.RuntimeConf // attachment i; 0 is the warm-up's
	store string                          // the folder the plugin keeps its state in
}

// benchAddDel times ADD and DEL of one attachment of galactic's side, then
// DELs it, b.N times, and the same of the peer's side in every iteration,
// the peer's untimed for ns/op but measured alike. Each verb is reported
// by wall time and by its plugins' CPU time (benchTimer), as the ratio of
// galactic's to the peer's, beside the load that ran with them.
//
// Fairness:
//   - Both sides are warmed with one untimed ADD and DEL, as the timed
//     ones: galactic's first ADD after the daemon's pins exist loads the
//     datapath program, which the kernel verifies (4–4.7 ms on a mean of
//     30), and the peer's first makes its bridge. Neither is what a node
//     pays per pod.
//   - Both sides' plugins are static Go builds, stripped, as shipped
//     (TestMain, stockPlugins): an exec of either loads no shared
//     libraries.
//   - Both sides keep their state on one filesystem: galactic's records
//     and host-local's reservations, and both libcni caches, all under the
//     test's TempDir, checked after the warm-up; neither side's writes are
//     cheaper for a faster disk.
//   - The order alternates: galactic first on even iterations, the peer
//     first on odd ones, so neither side always runs right after the
//     other's DEL: what a DEL leaves behind (the kernel's deferred work,
//     a warmer or colder cache) falls on both sides alike.
//   - The machine is shared: busy-% is the share of all CPUs' time spent
//     busy during the loops (both sides' verbs included: about 43 on an
//     otherwise idle 2-CPU machine), load1-start and load1-end the 1-minute
//     load average at each end (which lags: it still counts a set-up's
//     work), and cpus the CPUs. The CPU times, which waiting for a CPU does
//     not inflate, stand beside the wall times.
//
// With first, the warm-up is the first ADD of galactic's side after the
// daemon's pins exist, as after an upgrade: it is reported apart, as
// first-add-ns and first-add-cpu-ns, beside the peer's first ADD
// (bridge-first-add-ns), which makes its bridge.
func benchAddDel(b *testing.B, galactic, peer addDelSide, first bool) {
	timed := benchTimer(b)
	var warm [2]verbCost
	for i, s := range []addDelSide{galactic, peer} {
		rt := s.rt(0)
		timed(s.r, &warm[i], func(ctx context.Context) error {
			if _, err := s.r.cni.AddNetworkList(ctx, s.list, rt); err != nil {
				return fmt.Errorf("warm-up ADD of %s: %w", s.list.Name, err)
			}
			return nil
		})
		err := s.r.in(func(ctx context.Context) error {
			if err := s.r.cni.DelNetworkList(ctx, s.list, rt); err != nil {
				return fmt.Errorf("warm-up DEL of %s: %w", s.list.Name, err)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	sameFilesystem(b, galactic.store, peer.store, galactic.r.cache, peer.r.cache)
	addDel := func(s addDelSide, i int, add, del *verbCost) {
		rt := s.rt(i)
		timed(s.r, add, func(ctx context.Context) error { _, err := s.r.cni.AddNetworkList(ctx, s.list, rt); return err })
		timed(s.r, del, func(ctx context.Context) error { return s.r.cni.DelNetworkList(ctx, s.list, rt) })
	}
	var add, del, peerAdd, peerDel verbCost
	peerAddDel := func(i int) {
		b.StopTimer()
		addDel(peer, i, &peerAdd, &peerDel)
		b.StartTimer()
	}
	loadStart := load1(b)
	busyStart, allStart := cpuTicks(b)
	iters := 0
	for b.Loop() {
		if iters%2 == 0 {
			addDel(galactic, iters+1, &add, &del)
			peerAddDel(iters + 1)
		} else {
			peerAddDel(iters + 1)
			addDel(galactic, iters+1, &add, &del)
		}
		iters++
	}
	b.StopTimer()
	b.ReportMetric(loadStart, "load1-start")
	b.ReportMetric(load1(b), "load1-end")
	if busy, all := cpuTicks(b); all > allStart {
		b.ReportMetric(100*float64(busy-busyStart)/float64(all-allStart), "busy-%")
	}
	b.ReportMetric(float64(goruntime.NumCPU()), "cpus")
	if first { // reported after the loop: b.Loop's start drops earlier metrics
		b.ReportMetric(float64(warm[0].wall.Nanoseconds()), "first-add-ns")
		b.ReportMetric(float64(warm[0].cpu.Nanoseconds()), "first-add-cpu-ns")
		b.ReportMetric(float64(warm[1].wall.Nanoseconds()), "bridge-first-add-ns")
	}
	reportAddDel(b, iters, add, del, peerAdd, peerDel)
}

// reportAddDel reports ADD and DEL per iteration, galactic's and the
// bridge peer's, by wall time (…-ns) and plugin CPU time (…-cpu-ns), and
// each verb's ratio to the peer's.
func reportAddDel(b *testing.B, iters int, add, del, peerAdd, peerDel verbCost) {
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(iters) }
	for _, by := range []struct {
		unit string // "" for wall time, "-cpu" for CPU time
		of   func(verbCost) time.Duration
	}{
		{"", func(c verbCost) time.Duration { return c.wall }},
		{"-cpu", func(c verbCost) time.Duration { return c.cpu }},
	} {
		b.ReportMetric(per(by.of(add)), "add"+by.unit+"-ns")
		b.ReportMetric(per(by.of(del)), "del"+by.unit+"-ns")
		b.ReportMetric(per(by.of(peerAdd)), "bridge-add"+by.unit+"-ns")
		b.ReportMetric(per(by.of(peerDel)), "bridge-del"+by.unit+"-ns")
		b.ReportMetric(per(by.of(add))/per(by.of(peerAdd)), "add"+by.unit+"-x-of-bridge")
		b.ReportMetric(per(by.of(del))/per(by.of(peerDel)), "del"+by.unit+"-x-of-bridge")
	}
}

// BenchmarkLibcniAddDelAt times ADD and DEL of one more galactic-tap
// attachment through libcni with 0, 1,000 and 5,000 attachments of the same
// network already on the node, against one more bridge+host-local pod with
// as many pods already on the peer's bridge, in the same run. Setup makes
// the existing attachments through the plugins, untimed, eight at once.
//
// Fairness: each side has its own host namespace and libcni cache, so each
// meets only its own existing attachments. Every peer pod has a network
// namespace of its own, as on a real node (the timed one reuses one pod's,
// empty again after each DEL); galactic's attachments all name the same
// container namespace, which the plugin never enters (the tap is on the
// host). Warm-up, builds, one disk for both stores (galactic's records and
// host-local's reservations, both under the test's TempDir), the
// alternating order and the load: benchAddDel. ns/op is one galactic ADD
// plus its DEL; x-of-bridge compares each verb with the peer's at the same
// scale, by wall time, cpu-x-of-bridge by the plugins' CPU time.
// At 5,000 both sides spread over five masters, a VPC or a bridge each
// (perMaster); the timed attachment shares its master with 1,000.
func BenchmarkLibcniAddDelAt(b *testing.B) {
	for _, existing := range []int{0, 1000, 5000} {
		b.Run(fmt.Sprintf("existing=%d", existing), func(b *testing.B) {
			h := newCNIHost(b)
			r := quietRuntime(b, h)
			start := time.Now()
			galacticAt(b, r, existing)
			mid := time.Now()
			peer := newBridgePeer(b, existing+1)
			peer.at(b, existing)
			b.Logf("setup: %d galactic attachments in %v, %d bridge pods in %v", existing, mid.Sub(start).Round(time.Millisecond), existing, time.Since(mid).Round(time.Millisecond))
			newPod := peer.pods[existing]
			benchAddDel(b,
				addDelSide{r: r, list: r.list("1.1.0", "galactic", identity.Attachment(benchAttachment).Base62()), store: h.dataDir,
					rt: func(i int) *libcni.RuntimeConf { return r.rt(fmt.Sprintf("a%063x", i), "eth0") }},
				addDelSide{r: peer.r, list: peer.list, store: peer.ipam,
					rt: func(i int) *libcni.RuntimeConf { return peer.rt(fmt.Sprintf("b%063x", i), newPod) }},
				false) // galacticAt's warm-up was the first ADD
			requireGalacticTaps(b, h, existing)
			if got := peer.reservations(b); got != existing {
				b.Fatalf("host-local holds %d reservations, want %d", got, existing)
			}
		})
	}
}

// BenchmarkLibcniGCWith1000ValidAttachments times libcni's GCNetworkList
// (CNI 1.1.0) of the galactic network with 1,000 live attachments, every
// one listed in cni.dev/valid-attachments, so it must remove nothing,
// against the same GC of the bridge+host-local peer with 1,000 pods, in
// the same run; sides as in BenchmarkLibcniAddDelAt. libcni itself first
// reads its result cache (1,000 entries on each side) for attachments to
// DEL, then runs every plugin's GC. The bridge plugin of
// containernetworking/plugins v1.10.0 implements no GC (skel answers
// success without calling anything, and bridge never reaches host-local),
// so bridge-gc-ns is libcni's cache pass plus one exec; hostlocal-gc-ns is
// the same GC through libcni to host-local alone, over the same network's
// store, which does read its 1,000 reservations and keeps them all. ns/op
// is one galactic GC.
func BenchmarkLibcniGCWith1000ValidAttachments(b *testing.B) {
	const n = 1000
	h := newCNIHost(b)
	r := quietRuntime(b, h)
	start := time.Now()
	valid := galacticAt(b, r, n)
	mid := time.Now()
	peer := newBridgePeer(b, n+1)
	peerValid := peer.at(b, n)
	b.Logf("setup: %d galactic attachments in %v, %d bridge pods in %v", n, mid.Sub(start).Round(time.Millisecond), n, time.Since(mid).Round(time.Millisecond))
	galactic := r.list("1.1.0", "galactic", identity.Attachment(1).Base62())
	timed := benchTimer(b)
	var gc, peerGC, ipamGC verbCost
	iters := 0
	for b.Loop() {
		timed(r, &gc, func(ctx context.Context) error {
			return r.cni.GCNetworkList(ctx, galactic, &libcni.GCArgs{ValidAttachments: valid})
		})
		b.StopTimer()
		timed(peer.r, &peerGC, func(ctx context.Context) error {
			return peer.r.cni.GCNetworkList(ctx, peer.list, &libcni.GCArgs{ValidAttachments: peerValid})
		})
		timed(peer.r, &ipamGC, func(ctx context.Context) error {
			return peer.r.cni.GCNetworkList(ctx, peer.ipamOnly, &libcni.GCArgs{ValidAttachments: peerValid})
		})
		b.StartTimer()
		iters++
	}
	b.StopTimer()
	requireGalacticTaps(b, h, n)
	if got := peer.reservations(b); got != n {
		b.Fatalf("after GC host-local holds %d reservations, want %d", got, n)
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(iters) }
	b.ReportMetric(per(gc.wall), "gc-ns")
	b.ReportMetric(per(peerGC.wall), "bridge-gc-ns")
	b.ReportMetric(per(ipamGC.wall), "hostlocal-gc-ns")
	b.ReportMetric(per(gc.wall)/per(peerGC.wall), "gc-x-of-bridge")
	b.ReportMetric(per(gc.wall)/per(ipamGC.wall), "gc-x-of-hostlocal")
}
