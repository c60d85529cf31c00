package reclaim_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/vrf"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// unbraked is the configuration of the benchmarks that remove every tap
// of their node at once: no per-pass cap, no mass-removal brake, which
// would keep them all (brake.go); they time the removal itself.
var unbraked = reclaim.Config{MaxReclaimsPerPass: -1, MassRemovalShare: 1}

// noRows is a registry for benchmarks that register no eBPF rows.
type noRows struct{}

func (noRows) UnregisterInterface(context.Context, uint32) error { return nil }

func benchID(i int) identity.Identity {
	return identity.Identity{VPC: identity.VPC(1000 + i/1000), Attachment: identity.Attachment(i % 1000)}
}

// stampedTaps creates n persistent, stamped, unheld tenant taps, of the
// identities benchID(0) on.
func stampedTaps(b *testing.B, ns *nettest.NS, n int) []inventory.Object {
	return stampedTapsFrom(b, ns, 0, n)
}

// stampedTapsFrom is stampedTaps of the identities benchID(from) on, and
// returns the objects that would carry them.
func stampedTapsFrom(b *testing.B, ns *nettest.NS, from, n int) []inventory.Object {
	b.Helper()
	c := ns.Dial(b)
	var objs []inventory.Object
	for i := from; i < from+n; i++ {
		id := benchID(i)
		nettest.NewTap(b, ns, id.TapName(), tun.Mode{})
		objs = append(objs, inventory.AttachmentObject("bench", id.TapName(), id.VPC.Base62(), id.Attachment.Base62()))
	}
	links, err := c.Links(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	// One batch of alias writes through ip -batch keeps the set-up short.
	var batch strings.Builder
	for _, l := range links {
		if strings.HasPrefix(l.Name, "G") {
			fmt.Fprintf(&batch, "link set %s alias sandbox-%d\n", l.Name, l.Index)
		}
	}
	ipBatch(b, ns, batch.String())
	return objs
}

func ipBatch(b *testing.B, ns *nettest.NS, script string) time.Duration {
	b.Helper()
	cmd := exec.Command("ip", "-n", ns.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(script)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("ip -batch: %v: %.300s", err, out)
	}
	return time.Since(start)
}

// rawDump is the kernel's own cost: one RTM_GETLINK dump with statistics
// skipped, messages received and not parsed.
func rawDump(b *testing.B, c *netlink.Conn) int {
	req := []byte{unix.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, unix.IFLA_EXT_MASK, 0, 8, 0, 0, 0}
	msgs, err := c.Execute(netlink.Message{Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request | netlink.Dump}, Data: req})
	if err != nil {
		b.Fatal(err)
	}
	return len(msgs)
}

// BenchmarkPassWithNoRemovals runs a full pass over n live taps, and in the
// same run, as peers in the same namespace: a raw link dump (stats skipped,
// no parsing), rtnetlink's Link.List (tun driver registered), and
// `ip -d -o link show`.
func BenchmarkPassWithNoRemovals(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("taps=%d", n), func(b *testing.B) {
			ns := nettest.NewNS(b)
			objs := stampedTaps(b, ns, n)
			locks, _ := vrf.NewLocker(b.TempDir())
			r := reclaim.New(ns.Dial(b), &inventory.Static{Objects: objs, Synced: true}, noRows{}, locks, nil, nil, reclaim.Config{})
			raw, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: int(ns.File.Fd())})
			if err != nil {
				b.Fatal(err)
			}
			defer raw.Close()
			_ = raw.SetReadBuffer(4 << 20)
			rc, err := rtnetlink.Dial(&netlink.Config{NetNS: int(ns.File.Fd())})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = rc.Close() }()
			var peer, list, ipShow time.Duration
			for b.Loop() {
				rep := r.Pass(context.Background(), reclaim.PassOptions{})
				if rep.Inputs.StampedTaps != n || len(rep.Candidates) != 0 {
					b.Fatalf("pass read %d stamped taps, %d candidates", rep.Inputs.StampedTaps, len(rep.Candidates))
				}
				b.StopTimer()
				start := time.Now()
				rawDump(b, raw)
				peer += time.Since(start)
				start = time.Now()
				if _, err := rc.Link.List(); err != nil {
					b.Fatal(err)
				}
				list += time.Since(start)
				start = time.Now()
				if out, err := exec.Command("ip", "-n", ns.Name, "-d", "-o", "link", "show").CombinedOutput(); err != nil {
					b.Fatalf("ip: %v: %.200s", err, out)
				}
				ipShow += time.Since(start)
				b.StartTimer()
			}
			b.StopTimer()
			ours := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
			b.ReportMetric(per(peer), "rawdump-ns/op")
			b.ReportMetric(ours/per(peer), "x-of-rawdump")
			b.ReportMetric(ours/per(list), "x-of-linklist")
			b.ReportMetric(ours/per(ipShow), "x-of-ip")
			b.ReportMetric(ours/float64(n), "ns/tap")
		})
	}
}

// BenchmarkRemove1000ConfirmedTaps times the pass that removes 1,000
// confirmed stale taps, against `ip -batch` deleting 1,000 taps one by one
// and `ip link del group` of 1,000, each on fresh taps in the same run.
func BenchmarkRemove1000ConfirmedTaps(b *testing.B) {
	const n = 1000
	var ours, batch, group time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ns := nettest.NewNS(b)
		stampedTaps(b, ns, n)
		locks, _ := vrf.NewLocker(b.TempDir())
		liveOnly := []inventory.Object{inventory.AttachmentObject("bench", "live", "zzzz", "1")}
		r := reclaim.New(ns.Dial(b), &inventory.Static{Objects: liveOnly, Synced: true}, noRows{}, locks, nil, nil, unbraked)
		r.Pass(context.Background(), reclaim.PassOptions{})
		start := time.Now()
		b.StartTimer()
		rep := r.Pass(context.Background(), reclaim.PassOptions{})
		b.StopTimer()
		ours += time.Since(start)
		if len(rep.Reclaimed) != n {
			b.Fatalf("reclaimed %d of %d: %+v", len(rep.Reclaimed), n, rep.Failed)
		}

		peerNS := nettest.NewNS(b)
		stampedTaps(b, peerNS, n)
		var del strings.Builder
		for j := range n {
			fmt.Fprintf(&del, "link del %s\n", benchID(j).TapName())
		}
		batch += ipBatch(b, peerNS, del.String())

		stampedTaps(b, peerNS, n)
		var grp strings.Builder
		for j := range n {
			fmt.Fprintf(&grp, "link set %s group 4242\n", benchID(j).TapName())
		}
		ipBatch(b, peerNS, grp.String())
		start = time.Now()
		peerNS.IP(b, "link", "del", "group", "4242")
		group += time.Since(start)
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(per(batch), "ip-batch-ns/op")
	b.ReportMetric(per(group), "ip-group-ns/op")
	b.ReportMetric(per(ours)/per(batch), "x-of-ip-batch")
	b.ReportMetric(per(ours)/per(group), "x-of-ip-group")
}

// countingTransport counts requests by method, at the client.
type countingTransport struct {
	next     http.RoundTripper
	requests atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	return c.next.RoundTrip(r)
}

// BenchmarkAPIRequestsPerSteadyStatePass counts the API requests a pass
// makes once the inventory has synced: reads come from watches, so 0.
func BenchmarkAPIRequestsPerSteadyStatePass(b *testing.B) {
	cluster := clustertest.Shared(b)
	ns := nettest.NewNS(b)
	// Every tap carried: a steady-state pass removes nothing.
	for i := range stampedTaps(b, ns, 100) {
		id := benchID(i)
		cluster.Apply(b, kubeinventory.AttachmentResource, clustertest.Attachment("bench", fmt.Sprintf("att-%d", i), id.VPC.Base62(), id.Attachment.Base62()))
	}
	b.Cleanup(func() { cluster.DeleteAll(b, kubeinventory.AttachmentResource) })
	counter := &countingTransport{}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter }
	inv, err := kubeinventory.NewCluster(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inv.Start(ctx)
	if !inv.WaitForSync(ctx) {
		b.Fatal("inventory never synced")
	}
	locks, _ := vrf.NewLocker(b.TempDir())
	r := reclaim.New(ns.Dial(b), inv, noRows{}, locks, nil, nil, reclaim.Config{})
	r.Pass(ctx, reclaim.PassOptions{})
	before := counter.requests.Load()
	for b.Loop() {
		r.Pass(ctx, reclaim.PassOptions{})
	}
	b.ReportMetric(float64(counter.requests.Load()-before)/float64(b.N), "api-requests/pass")
}

// snapshotOnly hides that a source can prove itself current: the same pass
// without the consistent read, as a peer.
type snapshotOnly struct{ inventory.Source }

// BenchmarkRemovingPassProof measures a pass that removes 10 confirmed taps
// with the cluster inventory, which reads both resources consistently from a
// real API server (1,000 VPCAttachments) before removing, against the same
// pass over the same informers without that read, in the same run. It also
// counts the API requests of a removing pass.
func BenchmarkRemovingPassProof(b *testing.B) {
	const taps, objects = 10, 1000
	b.StopTimer()
	cluster := clustertest.Shared(b)
	cluster.DeleteAll(b, kubeinventory.AttachmentResource)
	b.Cleanup(func() { cluster.DeleteAll(b, kubeinventory.AttachmentResource) })
	for i := range objects {
		id := benchID(5000 + i)
		cluster.Apply(b, kubeinventory.AttachmentResource, clustertest.Attachment("bench", fmt.Sprintf("att-%d", i), id.VPC.Base62(), id.Attachment.Base62()))
	}
	var requests atomic.Int64
	cfg := rest.CopyConfig(cluster.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) { requests.Add(1); return rt.RoundTrip(r) })
	}
	inv, err := kubeinventory.NewCluster(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inv.Start(ctx)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if s := inv.Snapshot(ctx); s.Healthy() == nil && s.Attachments == objects {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("inventory never showed every attachment")
		}
	}
	locks, _ := vrf.NewLocker(b.TempDir())
	// removingPass times the pass that removes; only the proved one runs
	// under the benchmark's timer.
	removingPass := func(src inventory.Source, timed bool) (time.Duration, int64) {
		ns := nettest.NewNS(b)
		stampedTaps(b, ns, taps)
		r := reclaim.New(ns.Dial(b), src, noRows{}, locks, nil, nil, unbraked)
		r.Pass(ctx, reclaim.PassOptions{})
		before := requests.Load()
		start := time.Now()
		if timed {
			b.StartTimer()
		}
		rep := r.Pass(ctx, reclaim.PassOptions{})
		b.StopTimer()
		took := time.Since(start)
		if len(rep.Reclaimed) != taps {
			b.Fatalf("reclaimed %d of %d: %s %+v", len(rep.Reclaimed), taps, rep.Reason, rep.Kept)
		}
		return took, requests.Load() - before
	}
	var proved, bare time.Duration
	var calls int64
	for i := 0; i < b.N; i++ {
		d, n := removingPass(inv, true)
		proved, calls = proved+d, calls+n
		d, _ = removingPass(snapshotOnly{inv}, false)
		bare += d
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(per(bare), "unproved-ns/op")
	b.ReportMetric(per(proved)/per(bare), "x-of-unproved")
	b.ReportMetric(float64(calls)/float64(b.N), "api-requests/removing-pass")
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// clusterObjects makes the shared cluster hold exactly n VPCAttachments in
// namespace "scale", the first carries of them carrying the identities of
// stampedTaps' taps (benchID(0) on) and the rest others, and returns them as
// the inventory reads them. Objects already there are kept, so the
// benchmarks that need the same n create them once per run. Eight clients
// create them at once: one takes minutes at 100,000.
func clusterObjects(b *testing.B, n int) []inventory.Object {
	b.Helper()
	cluster := clustertest.Shared(b)
	objs := make([]inventory.Object, n)
	for i := range n {
		id := benchID(i)
		objs[i] = inventory.AttachmentObject("scale", fmt.Sprintf("att-%d", i), id.VPC.Base62(), id.Attachment.Base62())
	}
	ctx := context.Background()
	ri := cluster.Client.Resource(kubeinventory.AttachmentResource)
	list, err := ri.List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		b.Fatal(err)
	}
	if len(list.Items) == n {
		return objs
	}
	cluster.DeleteAll(b, kubeinventory.AttachmentResource)
	cluster.Apply(b, kubeinventory.AttachmentResource, clustertest.Attachment("scale", "att-0", benchID(0).VPC.Base62(), benchID(0).Attachment.Base62()))
	start := time.Now()
	var next atomic.Int64
	next.Store(1)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					errs <- nil
					return
				}
				id := benchID(i)
				obj := clustertest.Attachment("scale", fmt.Sprintf("att-%d", i), id.VPC.Base62(), id.Attachment.Base62())
				status := obj.Object["status"]
				created, err := ri.Namespace("scale").Create(ctx, obj, metav1.CreateOptions{})
				if err == nil {
					created.Object["status"] = status
					_, err = ri.Namespace("scale").UpdateStatus(ctx, created, metav1.UpdateOptions{})
				}
				if err != nil {
					errs <- fmt.Errorf("attachment %d: %w", i, err)
					return
				}
			}
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("created %d VPCAttachments in %s", n, time.Since(start).Round(time.Second))
	return objs
}

// scaleObjects is how many cluster objects the scale benchmarks hold:
// 100,000, or GALACTICTEST_SCALE_OBJECTS.
func scaleObjects(b *testing.B) int {
	if v := os.Getenv("GALACTICTEST_SCALE_OBJECTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10000 {
			b.Fatalf("GALACTICTEST_SCALE_OBJECTS=%q: want a number of at least 10000", v)
		}
		return n
	}
	return 100000
}

// startSynced runs a cluster inventory until the benchmark ends and waits
// until it shows want attachments.
func startSynced(b *testing.B, want int) *kubeinventory.Cluster {
	b.Helper()
	inv, err := kubeinventory.NewCluster(clustertest.Shared(b).Config, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	inv.Start(ctx)
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if s := inv.Snapshot(ctx); s.Healthy() == nil && s.Attachments == want {
			return inv
		}
		if time.Now().After(deadline) {
			b.Fatalf("inventory never showed %d attachments", want)
		}
	}
}

// fixedSource serves one snapshot built in advance: a pass whose inventory
// costs nothing, the floor for the others.
type fixedSource struct{ s inventory.Snapshot }

func (f fixedSource) Snapshot(context.Context) inventory.Snapshot { return f.s }

// BenchmarkPassWith100000ClusterObjects runs a pass over 10,000 live taps
// with the cluster inventory over 100,000 VPCAttachments of a real API
// server (10,000 of them carrying the taps), against the same pass, in the
// same run, with an inventory.Static of the same objects (which builds its
// snapshot on every pass) and with a snapshot built in advance (no
// inventory cost at all).
func BenchmarkPassWith100000ClusterObjects(b *testing.B) {
	const taps = 10000
	n := scaleObjects(b)
	objs := clusterObjects(b, n)
	inv := startSynced(b, n)
	ns := nettest.NewNS(b)
	stampedTaps(b, ns, taps)
	locks, _ := vrf.NewLocker(b.TempDir())
	static := &inventory.Static{Objects: objs, Synced: true}
	pass := func(src inventory.Source) *reclaim.Reclaimer {
		return reclaim.New(ns.Dial(b), src, noRows{}, locks, nil, nil, reclaim.Config{})
	}
	ours, withStatic, withFixed := pass(inv), pass(static), pass(fixedSource{static.Snapshot(context.Background())})
	check := func(rep reclaim.Report) {
		if rep.Inputs.StampedTaps != taps || len(rep.Candidates) != 0 || rep.Inputs.Identities != n {
			b.Fatalf("pass read %d stamped taps, %d identities, %d candidates: %s", rep.Inputs.StampedTaps, rep.Inputs.Identities, len(rep.Candidates), rep.Reason)
		}
	}
	timed := func(r *reclaim.Reclaimer) time.Duration {
		start := time.Now()
		check(r.Pass(context.Background(), reclaim.PassOptions{}))
		return time.Since(start)
	}
	var staticT, fixedT time.Duration
	for b.Loop() {
		check(ours.Pass(context.Background(), reclaim.PassOptions{}))
		b.StopTimer()
		staticT += timed(withStatic)
		fixedT += timed(withFixed)
		b.StartTimer()
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	oursT := per(b.Elapsed())
	b.ReportMetric(float64(n), "objects")
	b.ReportMetric(per(staticT), "static-ns/op")
	b.ReportMetric(oursT/per(staticT), "x-of-static")
	b.ReportMetric(oursT/per(fixedT), "x-of-prebuilt")
}

// BenchmarkRemovingPassAt100000Attachments measures a pass that removes one
// stale tap (of 101 stamped, 100 carried) with the cluster inventory over
// 100,000 VPCAttachments of a real API server, and what each part costs, in
// the same run: the informers' share (their initial list and sync: time,
// API requests, the heap they keep) against the proof's (the consistent
// read each removing pass makes: time and requests, measured alone after
// the pass), the pass's requests and allocations, and the process's RSS.
// The peer is client-go's own paginated consistent list of the same objects
// (dynamic client, 5,000 a page, both resources): the bare way to read them.
func BenchmarkRemovingPassAt100000Attachments(b *testing.B) {
	const live = 100
	n := scaleObjects(b)
	clusterObjects(b, n)
	var requests atomic.Int64
	cfg := rest.CopyConfig(clustertest.Shared(b).Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) { requests.Add(1); return rt.RoundTrip(r) })
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	inv, err := kubeinventory.NewCluster(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	inv.Start(ctx)
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if s := inv.Snapshot(ctx); s.Healthy() == nil && s.Attachments == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("inventory never showed %d attachments", n)
		}
	}
	syncT, syncReq := time.Since(start), requests.Load()
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)

	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	peerList := func() int { return clientgoList(ctx, b, dc) }
	locks, _ := vrf.NewLocker(b.TempDir())
	var passT, proveT, peerT time.Duration
	var passReq, proveReq, peerReq int64
	var passAlloc float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ns := nettest.NewNS(b)
		stampedTaps(b, ns, live)     // carried by the first 100 objects
		stampedTapsFrom(b, ns, n, 1) // benchID(n): no object carries it
		r := reclaim.New(ns.Dial(b), inv, noRows{}, locks, nil, nil, reclaim.Config{})
		if rep := r.Pass(ctx, reclaim.PassOptions{}); len(rep.Candidates) != 1 {
			b.Fatalf("the marking pass found %d candidates: %s", len(rep.Candidates), rep.Reason)
		}
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		req0 := requests.Load()
		start := time.Now()
		b.StartTimer()
		rep := r.Pass(ctx, reclaim.PassOptions{})
		b.StopTimer()
		passT += time.Since(start)
		passReq += requests.Load() - req0
		runtime.ReadMemStats(&m1)
		passAlloc += float64(m1.TotalAlloc - m0.TotalAlloc)
		if len(rep.Reclaimed) != 1 {
			b.Fatalf("reclaimed %d of 1: %s %s %+v", len(rep.Reclaimed), rep.Result, rep.Reason, rep.Kept)
		}

		req0, start = requests.Load(), time.Now()
		if proof, err := inv.Prove(ctx); err != nil || proof.Attachments != n {
			b.Fatalf("proof of %d attachments: %v", proof.Attachments, err)
		}
		proveT += time.Since(start)
		proveReq += requests.Load() - req0

		req0, start = requests.Load(), time.Now()
		if got := peerList(); got != n {
			b.Fatalf("client-go listed %d objects, want %d", got, n)
		}
		peerT += time.Since(start)
		peerReq += requests.Load() - req0
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	perN := func(v float64) float64 { return v / float64(b.N) }
	b.ReportMetric(float64(n), "objects")
	b.ReportMetric(perN(float64(passReq)), "api-requests/pass")
	b.ReportMetric(perN(passAlloc)/(1<<20), "pass-alloc-MiB")
	b.ReportMetric(per(proveT), "proof-ns")
	b.ReportMetric(perN(float64(proveReq)), "proof-api-requests")
	b.ReportMetric(per(proveT)/per(passT), "proof-share-of-pass")
	b.ReportMetric(per(peerT), "clientgo-list-ns")
	b.ReportMetric(perN(float64(peerReq)), "clientgo-list-api-requests")
	b.ReportMetric(per(passT)/per(peerT), "x-of-clientgo-list")
	b.ReportMetric(per(proveT)/per(peerT), "proof-x-of-clientgo-list")
	b.ReportMetric(syncT.Seconds(), "sync-s")
	b.ReportMetric(float64(syncReq), "sync-api-requests")
	b.ReportMetric(float64(syncT.Nanoseconds())/per(peerT), "sync-x-of-clientgo-list")
	b.ReportMetric(heap/(1<<20), "inventory-heap-MiB")
	b.ReportMetric(vmRSS(b), "rss-MiB")
}

// clientgoList reads both resources as Prove does, the client-go way
// (5,000 a page), and returns how many objects they hold: the peer of the
// removing passes' reads.
func clientgoList(ctx context.Context, b *testing.B, dc dynamic.Interface) int {
	objects := 0
	for _, gvr := range []schema.GroupVersionResource{kubeinventory.AttachmentResource, kubeinventory.AdvertisementResource} {
		opts := metav1.ListOptions{Limit: 5000}
		for {
			list, err := dc.Resource(gvr).List(ctx, opts)
			if err != nil {
				b.Fatal(err)
			}
			objects += len(list.Items)
			if opts.Continue = list.GetContinue(); opts.Continue == "" {
				break
			}
		}
	}
	return objects
}

// vmRSS is this process's resident set, in MiB.
func vmRSS(b *testing.B) float64 {
	b.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				b.Fatalf("VmRSS %q: %v", rest, err)
			}
			return float64(kib) / 1024
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// BenchmarkClusterInventoryHeapWith100000Objects reports the heap a node's
// cluster inventory keeps over 100,000 VPCAttachments of a real API server,
// through the real informers: live heap after a GC, before the source is
// made and once it shows every object.
func BenchmarkClusterInventoryHeapWith100000Objects(b *testing.B) {
	n := scaleObjects(b)
	clusterObjects(b, n)
	var heap float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		inv := startSynced(b, n)
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap += float64(after.HeapAlloc) - float64(before.HeapAlloc)
		runtime.KeepAlive(inv)
	}
	b.ReportMetric(float64(n), "objects")
	b.ReportMetric(heap/float64(b.N)/(1<<20), "heap-MiB")
}
