package reclaim_test

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/internal/clustertest"
	"github.com/datum-cloud/galactic-node/internal/nettest"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/vrf"
)

// noRows is a registry for benchmarks that register no eBPF rows.
type noRows struct{}

func (noRows) UnregisterInterface(context.Context, uint32) error { return nil }

func benchID(i int) identity.Identity {
	return identity.Identity{VPC: identity.VPC(1000 + i/1000), Attachment: identity.Attachment(i % 1000)}
}

// stampedTaps creates n persistent, stamped, unheld tenant taps.
func stampedTaps(b *testing.B, ns *nettest.NS, n int) []inventory.Object {
	b.Helper()
	c := ns.Dial(b)
	var objs []inventory.Object
	for i := range n {
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
		r := reclaim.New(ns.Dial(b), &inventory.Static{Objects: liveOnly, Synced: true}, noRows{}, locks, nil, nil, reclaim.Config{})
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
		r := reclaim.New(ns.Dial(b), src, noRows{}, locks, nil, nil, reclaim.Config{})
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
