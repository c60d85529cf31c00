package reclaim_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/vrf"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// meteredTransport counts a client's requests and the bytes of their
// answers' bodies as read.
type meteredTransport struct {
	next            http.RoundTripper
	requests, bytes atomic.Int64
}

func (m *meteredTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	m.requests.Add(1)
	resp, err := m.next.RoundTrip(r)
	if err == nil {
		resp.Body = &countedBody{ReadCloser: resp.Body, n: &m.bytes}
	}
	return resp, err
}

type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c *countedBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// BenchmarkCandidatesRemovingPass measures a pass of the candidates
// inventory (--inventory=candidates) that removes k stale taps, k = 1 and
// 10, with 1,000 and then 100,000 VPCAttachments in a real API server
// (GALACTICTEST_SCALE_OBJECTS for the second), in one run: its wall time,
// API requests and bytes read per pass, and the heap the source keeps. The
// peers, measured in the same loop: the informers' removing pass's proof
// (kubeinventory.Cluster.Prove, 94% of that pass at 100,000) and
// client-go's paginated consistent list of both resources. The steady pass
// (every tap held or none) makes no request: its count is reported too.
// The node's only taps are the k stale ones, so the share rule is off:
// it would hold them all. What the pass and the proof cost the API server
// in CPU is reported too (utime+stime over each).
func BenchmarkCandidatesRemovingPass(b *testing.B) {
	var wallAt1000 [11]float64
	for _, n := range []int{1000, scaleObjects(b)} {
		clusterObjects(b, n)
		for _, k := range []int{1, 10} {
			b.Run(fmt.Sprintf("objects=%d/k=%d", n, k), func(b *testing.B) {
				benchCandidatesPass(b, n, k, &wallAt1000[k])
			})
		}
	}
}

func benchCandidatesPass(b *testing.B, n, k int, wallAt1000 *float64) {
	meter := &meteredTransport{}
	cfg := rest.CopyConfig(clustertest.Shared(b).Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { meter.next = rt; return meter }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	inv, err := kubeinventory.NewCandidates(cfg, nil, kubeinventory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	informers, err := kubeinventory.NewCluster(cfg, nil) // never started: its Prove reads alone
	if err != nil {
		b.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	peerList := func() int { return clientgoList(ctx, b, dc) }
	cluster := clustertest.Shared(b)
	pid, err := clustertest.ProcessOf("kube-apiserver", cluster.Env.ControlPlane.APIServer.CertDir)
	if err != nil {
		b.Fatal(err)
	}
	apiCPU := func() float64 {
		cpu, err := clustertest.CPUSeconds(pid)
		if err != nil {
			b.Fatal(err)
		}
		return cpu
	}
	var passCPU, proveCPU float64
	locks, _ := vrf.NewLocker(b.TempDir())
	var passT, proveT, peerT time.Duration
	var passReq, passBytes, steadyReq int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ns := nettest.NewNS(b)
		r := reclaim.New(ns.Dial(b), inv, noRows{}, locks, nil, nil, unbraked)
		req0 := meter.requests.Load()
		r.Pass(ctx, reclaim.PassOptions{}) // no tap: asks nothing
		steadyReq += meter.requests.Load() - req0
		stampedTapsFrom(b, ns, n, k) // benchID(n) on: no object carries them
		if rep := r.Pass(ctx, reclaim.PassOptions{}); len(rep.Candidates) != k {
			b.Fatalf("the marking pass found %d candidates of %d: %s", len(rep.Candidates), k, rep.Reason)
		}
		req0, bytes0 := meter.requests.Load(), meter.bytes.Load()
		start, cpu0 := time.Now(), apiCPU()
		b.StartTimer()
		rep := r.Pass(ctx, reclaim.PassOptions{})
		b.StopTimer()
		passT += time.Since(start)
		passCPU += apiCPU() - cpu0
		passReq += meter.requests.Load() - req0
		passBytes += meter.bytes.Load() - bytes0
		if len(rep.Reclaimed) != k {
			b.Fatalf("reclaimed %d of %d: %s %s %+v", len(rep.Reclaimed), k, rep.Result, rep.Reason, rep.Kept)
		}

		start, cpu0 = time.Now(), apiCPU()
		if proof, err := informers.Prove(ctx); err != nil || proof.Attachments != n {
			b.Fatalf("informers' proof of %d attachments: %v", proof.Attachments, err)
		}
		proveT += time.Since(start)
		proveCPU += apiCPU() - cpu0
		start = time.Now()
		if got := peerList(); got != n {
			b.Fatalf("client-go listed %d objects, want %d", got, n)
		}
		peerT += time.Since(start)
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(inv)
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	perN := func(v int64) float64 { return float64(v) / float64(b.N) }
	if got, bound := perN(passReq), float64(3*k+2); got > bound {
		b.Errorf("%.1f API requests a removing pass, more than 3k+2 = %.0f", got, bound)
	}
	if perN(steadyReq) != 0 {
		b.Errorf("a pass with no unheld tap made %.1f API requests, want 0", perN(steadyReq))
	}
	b.ReportMetric(float64(n), "objects")
	b.ReportMetric(perN(passReq), "api-requests/pass")
	b.ReportMetric(perN(passBytes)/float64(k), "api-bytes/candidate")
	b.ReportMetric(perN(steadyReq), "steady-api-requests/pass")
	// The API server's CPU over the pass and over the proof, each with
	// what it burns idle meanwhile (about 5% of a core here): small
	// against a proof, not against a pass at 1,000 objects.
	b.ReportMetric(passCPU*1000/float64(b.N), "api-cpu-ms/pass")
	b.ReportMetric(proveCPU*1000/float64(b.N), "informer-proof-api-cpu-ms")
	b.ReportMetric(passCPU/proveCPU, "api-cpu-x-of-informer-proof")
	b.ReportMetric(per(proveT), "informer-proof-ns")
	b.ReportMetric(per(passT)/per(proveT), "x-of-informer-proof")
	b.ReportMetric(per(peerT), "clientgo-list-ns")
	b.ReportMetric(per(passT)/per(peerT), "x-of-clientgo-list")
	b.ReportMetric((float64(after.HeapAlloc)-float64(before.HeapAlloc))/(1<<20), "heap-growth-MiB")
	if n == 1000 {
		*wallAt1000 = per(passT)
	} else if *wallAt1000 > 0 {
		b.ReportMetric(per(passT) / *wallAt1000, "x-of-1000-objects")
	}
}
