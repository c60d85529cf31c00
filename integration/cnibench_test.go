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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/datum-cloud/galactic-node/internal/nettest"
	"github.com/datum-cloud/galactic-node/node/identity"
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
		lists[i] = r.list("1.1.0", "galactic", identity.Attachment(i+1).Base62())
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
		if name := tapName(identity.Attachment(i + 1).Base62()); !have[name] {
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
	ipam     string                    // host-local's data dir
	pods     []string                  // the pods' namespaces, by path
}

func newBridgePeer(tb testing.TB, pods int) *bridgePeer {
	tb.Helper()
	r := quietRuntime(tb, &cniHost{t: tb, host: nettest.NewNS(tb)})
	ipam := filepath.Join(tb.TempDir(), "host-local")
	ipamConf := map[string]any{"type": "host-local", "subnet": "10.99.0.0/16", "dataDir": ipam}
	return &bridgePeer{r: r, ipam: ipam, pods: podNamespaces(tb, pods),
		list:     benchConfList(tb, "peer", map[string]any{"type": "bridge", "bridge": "cnibr0", "isGateway": true, "ipam": ipamConf}),
		ipamOnly: benchConfList(tb, "peer", map[string]any{"type": "host-local", "ipam": ipamConf})}
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
			_, err := p.r.cni.AddNetworkList(ctx, p.list, p.rt(valid[i].ContainerID, p.pods[i]))
			return err
		})
	})
	return valid
}

// reservations counts host-local's address reservations.
func (p *bridgePeer) reservations(tb testing.TB) int {
	tb.Helper()
	entries, err := os.ReadDir(filepath.Join(p.ipam, "peer"))
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip.") {
			n++
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

// benchTimer adds the wall time of verbs run in a runtime's host namespace.
func benchTimer(tb testing.TB) func(r *runtime, d *time.Duration, fn func(ctx context.Context) error) {
	return func(r *runtime, d *time.Duration, fn func(ctx context.Context) error) {
		start := time.Now()
		if err := r.in(fn); err != nil {
			tb.Fatal(err)
		}
		*d += time.Since(start)
	}
}

// BenchmarkLibcniAddDelAt times ADD and DEL of one more galactic-tap
// attachment through libcni with 0 and 1,000 attachments of the same
// network already on the node, against one more bridge+host-local pod with
// as many pods already on the peer's bridge, in the same run. Setup makes
// the existing attachments through the plugins, untimed, eight at once.
//
// Fairness: each side has its own host namespace and libcni cache, so each
// meets only its own existing attachments. Every peer pod has a network
// namespace of its own, as on a real node (the timed one reuses one pod's,
// empty again after each DEL); galactic's attachments all name the same
// container namespace, which the plugin never enters (the tap is on the
// host). ns/op is one galactic ADD plus its DEL; x-of-bridge compares each
// verb with the peer's at the same scale.
func BenchmarkLibcniAddDelAt(b *testing.B) {
	for _, existing := range []int{0, 1000} {
		b.Run(fmt.Sprintf("existing=%d", existing), func(b *testing.B) {
			h := newCNIHost(b)
			r := quietRuntime(b, h)
			start := time.Now()
			galacticAt(b, r, existing)
			mid := time.Now()
			peer := newBridgePeer(b, existing+1)
			peer.at(b, existing)
			b.Logf("setup: %d galactic attachments in %v, %d bridge pods in %v", existing, mid.Sub(start).Round(time.Millisecond), existing, time.Since(mid).Round(time.Millisecond))
			galactic := r.list("1.1.0", "galactic", identity.Attachment(benchAttachment).Base62())
			newPod := peer.pods[existing]
			timed := benchTimer(b)
			var add, del, peerAdd, peerDel time.Duration
			iters := 0
			for b.Loop() {
				rt := r.rt(fmt.Sprintf("a%063x", iters), "eth0")
				timed(r, &add, func(ctx context.Context) error { _, err := r.cni.AddNetworkList(ctx, galactic, rt); return err })
				timed(r, &del, func(ctx context.Context) error { return r.cni.DelNetworkList(ctx, galactic, rt) })
				b.StopTimer()
				prt := peer.rt(fmt.Sprintf("b%063x", iters), newPod)
				timed(peer.r, &peerAdd, func(ctx context.Context) error { _, err := peer.r.cni.AddNetworkList(ctx, peer.list, prt); return err })
				timed(peer.r, &peerDel, func(ctx context.Context) error { return peer.r.cni.DelNetworkList(ctx, peer.list, prt) })
				b.StartTimer()
				iters++
			}
			b.StopTimer()
			requireGalacticTaps(b, h, existing)
			if got := peer.reservations(b); got != existing {
				b.Fatalf("host-local holds %d reservations, want %d", got, existing)
			}
			reportAddDel(b, iters, add, del, peerAdd, peerDel)
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
	var gc, peerGC, ipamGC time.Duration
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
	b.ReportMetric(per(gc), "gc-ns")
	b.ReportMetric(per(peerGC), "bridge-gc-ns")
	b.ReportMetric(per(ipamGC), "hostlocal-gc-ns")
	b.ReportMetric(per(gc)/per(peerGC), "gc-x-of-bridge")
	b.ReportMetric(per(gc)/per(ipamGC), "gc-x-of-hostlocal")
}
