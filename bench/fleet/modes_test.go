package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

// Knobs of BenchmarkFleetModes.
const (
	envModes  = "GALACTICTEST_FLEET_MODES"  // "informers:5x2000,candidates:50x2000": mode:nodes x objects
	envSpread = "GALACTICTEST_FLEET_SPREAD" // the mass event's window: every node removes within it (60s)
	envProbe  = "GALACTICTEST_FLEET_PROBE"  // each node's probe interval, as --inventory-max-age/4 (5s)
)

type modeSize struct {
	mode           string
	nodes, objects int
}

// BenchmarkFleetModes runs N simulated nodes of one inventory mode
// (--inventory: informers or candidates) against one real kube-apiserver
// and etcd holding M objects (BenchmarkFleet's population), through three
// phases, and reports for each the API server's CPU-seconds (utime+stime
// from /proc), the bytes the nodes read from it (each node's response
// bodies, counted at its transport: what the API server sent them), and
// the time until the last node was done, in all and per node:
//
//   - start: every node starts (10 at a time) until it is ready: the
//     informers synced, the candidates' first read of health and size done;
//   - restart: the API server is stopped and started, and every node is back:
//     the informers relisted and healthy, the candidates' next read done;
//   - mass: once the watch caches the restart emptied are ready again
//     (caches-ready-s after the API server started), a mass event leaves
//     one stale tap on every node, and every node makes the read its
//     removing pass makes, all starting within the spread: the informers'
//     consistent read of everything (Prove), the candidates' ask about the
//     one identity (Ask: the size read and the identity's reads).
//
// Every node probes every GALACTICTEST_FLEET_PROBE, as the daemon does
// every quarter of --inventory-max-age, in both modes. Each phase's CPU is
// also reported net of the API server's baseline (what it burns with no
// node, measured after the populate, times the phase's length): what the
// nodes cost it, which the ratio between the modes weighs.
func BenchmarkFleetModes(b *testing.B) {
	for _, m := range modeSizes(b) {
		b.Run(fmt.Sprintf("mode=%s/nodes=%d/objects=%d", m.mode, m.nodes, m.objects), func(b *testing.B) { runModes(b, m) })
	}
}

func modeSizes(b *testing.B) []modeSize {
	spec := os.Getenv(envModes)
	if spec == "" {
		spec = "informers:5x2000,candidates:50x2000"
	}
	var out []modeSize
	for _, f := range strings.Split(spec, ",") {
		mode, sz, ok := strings.Cut(strings.TrimSpace(f), ":")
		n, m, ok2 := strings.Cut(sz, "x")
		nodes, err1 := strconv.Atoi(n)
		objects, err2 := strconv.Atoi(m)
		if !ok || !ok2 || (mode != "informers" && mode != "candidates") || err1 != nil || err2 != nil || nodes < 1 || objects < 10 {
			b.Fatalf("%s: %q is not MODE:NODESxOBJECTS (MODE informers or candidates)", envModes, f)
		}
		out = append(out, modeSize{mode, nodes, objects})
	}
	return out
}

func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s: %q is not a positive duration", name, v)
	}
	return d
}

// modeNode is one simulated node of either mode, and what it read.
type modeNode struct {
	id        int
	informers *kubeinventory.Cluster
	asker     *kubeinventory.Candidates
	bytes     atomic.Int64
	// relisted is when the informers last finished an initial list (unix
	// nanoseconds): a plain list's end, or a watch-list's initial-events-end
	// bookmark (client-go lists through a streaming watch, WatchListClient).
	relisted atomic.Int64
}

func (n *modeNode) count(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		q := r.URL.Query()
		watchList := q.Get("sendInitialEvents") == "true"
		list := !q.Has("watch") && q.Has("resourceVersion")
		resp, err := rt.RoundTrip(r)
		if err == nil {
			body := &countingBody{ReadCloser: resp.Body, n: &n.bytes}
			if watchList || list {
				body.relisted, body.watchList = &n.relisted, watchList
			}
			resp.Body = body
		}
		return resp, err
	})
}

// initialEventsEnd is the annotation of the bookmark that ends a watch-list's
// initial events.
const initialEventsEnd = `"k8s.io/initial-events-end":"true"`

type countingBody struct {
	io.ReadCloser
	n         *atomic.Int64
	relisted  *atomic.Int64
	watchList bool
	tail      []byte // the end of what was read, for a marker split across reads
}

func (c *countingBody) Read(p []byte) (int, error) {
	k, err := c.ReadCloser.Read(p)
	c.n.Add(int64(k))
	if c.relisted != nil {
		if c.watchList {
			c.tail = append(c.tail, p[:k]...)
			if strings.Contains(string(c.tail), initialEventsEnd) {
				c.relisted.Store(time.Now().UnixNano())
				c.relisted = nil
			} else if len(c.tail) > len(initialEventsEnd) {
				c.tail = c.tail[len(c.tail)-len(initialEventsEnd):]
			}
		} else if err == io.EOF {
			c.relisted.Store(time.Now().UnixNano())
			c.relisted = nil
		}
	}
	return k, err
}

// healthy reports whether the node's inventory is ready: synced and
// reading (informers), or its newest read succeeded (candidates).
func (n *modeNode) healthy(ctx context.Context) bool {
	if n.informers != nil {
		s := n.informers.Snapshot(ctx)
		return s.Synced && s.Err == nil
	}
	s := n.asker.Snapshot(ctx)
	return s.Synced && s.Err == nil
}

func (n *modeNode) provenAt() time.Time {
	if n.informers != nil {
		return n.informers.ProvenAt()
	}
	return n.asker.ProvenAt()
}

// removingRead is the read a removing pass of the node makes for one
// stale tap.
func (n *modeNode) removingRead(ctx context.Context, stale identity.Identity) error {
	var s inventory.Snapshot
	var err error
	if n.informers != nil {
		s, err = n.informers.Prove(ctx)
	} else {
		s, err = n.asker.Ask(ctx, []identity.Identity{stale})
	}
	if err == nil {
		err = s.Healthy()
	}
	if err == nil && s.Carried(stale) {
		err = fmt.Errorf("%s carried", stale)
	}
	return err
}

func runModes(b *testing.B, m modeSize) {
	spread := envDuration(b, envSpread, 60*time.Second)
	probe := envDuration(b, envProbe, 5*time.Second)
	// The API server's default request timeout (60 s), not the tests' 5 s:
	// a page of 5,000 objects served to many nodes at once on two cores
	// takes longer, as it may on a loaded control plane.
	cluster := clustertest.StartWith(b, func(a *envtest.APIServer) { a.Configure().Set("request-timeout", "60s") })
	b.Cleanup(func() { _ = cluster.Env.Stop() })
	api := procOf(b, "kube-apiserver", cluster.Env.ControlPlane.APIServer.CertDir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	populate(b, cluster.Config, m.objects, envInt(b, envWriters, 8))
	b.ReportMetric(time.Since(start).Seconds(), "populate-s")
	b.Logf("populated %d objects in %s", m.objects, time.Since(start).Round(time.Second))
	// What the API server burns with no node at all (its GC over M
	// objects, its own controllers), after the writes settled: each phase
	// is also reported net of it, which is what the nodes cost it.
	time.Sleep(5 * time.Second)
	base0, tb := api.cpuSeconds(), time.Now()
	time.Sleep(15 * time.Second)
	baseline := (api.cpuSeconds() - base0) / time.Since(tb).Seconds()
	b.Logf("baseline: API server %.2f%% CPU with no node", baseline*100)
	b.ReportMetric(baseline*100, "baseline-api-cpu-%")

	nodes := make([]*modeNode, m.nodes)
	opts := kubeinventory.Options{ProbeInterval: probe}
	for i := range nodes {
		n := &modeNode{id: i}
		cfg := ownConfig(cluster.Config, fmt.Sprintf("fleet-node-%d", i), 0, 0, n.count)
		var err error
		if m.mode == "informers" {
			n.informers, err = kubeinventory.NewCluster(cfg, nil, opts)
		} else {
			n.asker, err = kubeinventory.NewCandidates(cfg, nil, opts)
		}
		if err != nil {
			b.Fatal(err)
		}
		nodes[i] = n
	}
	read := func() int64 {
		var sum int64
		for _, n := range nodes {
			sum += n.bytes.Load()
		}
		return sum
	}
	waitAll := func(phase string, done func(*modeNode) bool) time.Duration {
		t0 := time.Now()
		for deadline := t0.Add(30 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			left := 0
			for _, n := range nodes {
				if !done(n) {
					left++
				}
			}
			if left == 0 {
				return time.Since(t0)
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: %d of %d nodes not done within 30m", phase, left, len(nodes))
			}
		}
	}
	report := func(phase string, cpu float64, bytes int64, wall, window time.Duration) {
		net := max(cpu-baseline*window.Seconds(), 0)
		// Logged too: a later phase that fails drops the reported metrics.
		b.Logf("%s: API server %.2f CPU-s (%.4f a node), %.2f net of its baseline over %s (%.4f a node), %.1f MiB read (%.1f KiB a node), last node done after %s",
			phase, cpu, cpu/float64(m.nodes), net, window.Round(time.Second), net/float64(m.nodes), float64(bytes)/(1<<20), float64(bytes)/float64(m.nodes)/(1<<10), wall.Round(time.Millisecond))
		b.ReportMetric(cpu, phase+"-api-cpu-s")
		b.ReportMetric(cpu/float64(m.nodes), phase+"-api-cpu-s/node")
		b.ReportMetric(net/float64(m.nodes), phase+"-net-api-cpu-s/node")
		b.ReportMetric(float64(bytes)/(1<<20), phase+"-MiB")
		b.ReportMetric(float64(bytes)/float64(m.nodes)/(1<<10), phase+"-KiB/node")
		b.ReportMetric(wall.Seconds(), phase+"-s")
	}

	// (a) Start-up, 10 nodes at a time.
	cpu0, bytes0, t0 := api.cpuSeconds(), read(), time.Now()
	for lo := 0; lo < len(nodes); lo += 10 {
		group := nodes[lo:min(lo+10, len(nodes))]
		for _, n := range group {
			if n.informers != nil {
				n.informers.Start(ctx)
			} else {
				n.asker.Start(ctx)
			}
		}
		for _, n := range group {
			for !n.healthy(ctx) {
				if time.Since(t0) > 30*time.Minute {
					b.Fatalf("start: node %d not ready within 30m", n.id)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	report("start", api.cpuSeconds()-cpu0, read()-bytes0, time.Since(t0), time.Since(t0))

	// Idle: probes only, in both modes.
	cpu0, t0 = api.cpuSeconds(), time.Now()
	time.Sleep(max(probe, 15*time.Second))
	idle := (api.cpuSeconds() - cpu0) / time.Since(t0).Seconds() * 100
	b.Logf("idle: API server %.2f%% CPU, %.3f%% a node net of its baseline", idle, (idle-baseline*100)/float64(m.nodes))
	b.ReportMetric(idle, "idle-api-cpu-%")
	b.ReportMetric((idle-baseline*100)/float64(m.nodes), "idle-net-api-cpu-%/node")

	// (b) The API server restarts: its watch cache starts anew.
	apiserver := cluster.Env.ControlPlane.GetAPIServer()
	stopped := time.Now()
	if err := apiserver.Stop(); err != nil {
		// envtest waits 20 s for SIGTERM, then kills: with a thousand
		// connections open the API server drains longer than that.
		if !strings.Contains(err.Error(), "timeout waiting") {
			b.Fatal(err)
		}
		b.Logf("restart: %v (SIGKILLed, as a crashed API server)", err)
	}
	if err := apiserver.Start(); err != nil {
		b.Fatal(err)
	}
	restarted := time.Now()
	// In a cluster the controllers that write these resources watch them,
	// so their watch caches start with the API server; here nothing else
	// asks for BGPAdvertisements. Ask from now on, as they would, and note
	// when each cache first answers a read with a selector (a cache still
	// initializing refuses one, 429).
	cachesReadyAt := make(chan time.Duration, 1)
	go func() {
		for _, gvr := range []schema.GroupVersionResource{kubeinventory.AttachmentResource, kubeinventory.AdvertisementResource} {
			if err := cachesReady(ctx, cluster.Config, gvr); err != nil {
				b.Errorf("%s: watch cache not ready: %v", gvr.Resource, err)
			}
		}
		cachesReadyAt <- time.Since(restarted)
	}()
	api = procOf(b, "kube-apiserver", cluster.Env.ControlPlane.APIServer.CertDir)
	cpu0, bytes0, t0 = api.cpuSeconds(), read(), time.Now()
	back := waitAll("restart", func(n *modeNode) bool {
		if n.informers != nil {
			return n.relisted.Load() > stopped.UnixNano() && n.healthy(ctx)
		}
		return n.provenAt().After(stopped) && n.healthy(ctx)
	})
	report("restart", api.cpuSeconds()-cpu0, read()-bytes0, back, time.Since(t0))

	// A mass event is not a restart: it starts once the caches are ready.
	ready := <-cachesReadyAt
	b.Logf("watch caches ready %s after the API server started", ready.Round(time.Millisecond))
	b.ReportMetric(ready.Seconds(), "caches-ready-s")

	// (c) A mass event: every node removes one stale tap within spread.
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	cpu0, bytes0, t0 = api.cpuSeconds(), read(), time.Now()
	for i, n := range nodes {
		at := t0.Add(spread * time.Duration(i) / time.Duration(len(nodes)))
		stale := identity.Identity{VPC: probeVPC + identity.VPC(len(nodes)+i), Attachment: 1}
		wg.Go(func() {
			time.Sleep(time.Until(at))
			errs[i] = n.removingRead(ctx, stale)
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	failed := 0
	for i, err := range errs {
		if err != nil {
			if failed == 0 {
				b.Logf("node %d: %v", i, err)
				b.Logf("the same read through client-go now: %v", clientgoRead(ctx, cluster.Config, probeVPC+identity.VPC(len(nodes)+i)))
			}
			failed++
		}
	}
	report("mass", api.cpuSeconds()-cpu0, read()-bytes0, wall, wall)
	b.ReportMetric(float64(failed), "mass-failed-nodes")
	if failed > 0 {
		b.Errorf("mass: %d of %d nodes' removing reads failed", failed, len(nodes))
	}
}

// cachesReady waits until the API server answers a list of gvr with a
// field selector, which it refuses (429) while the resource's watch cache is
// initializing (k8s.io/apiserver pkg/storage/cacher/delegator.go,
// shouldDelegateListOnNotReadyCache), for at most 10 minutes, asking every
// 500 ms.
func cachesReady(ctx context.Context, cfg *rest.Config, gvr schema.GroupVersionResource) error {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for {
		_, err := dc.Resource(gvr).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=no-such-object", Limit: 1})
		if err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// clientgoRead lists the advertisements of one probe identity the way a
// client-go caller would, for the API server's own words when the nodes'
// reads fail.
func clientgoRead(ctx context.Context, cfg *rest.Config, vpc identity.VPC) error {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	name := identity.Identity{VPC: vpc, Attachment: 1}.AdvertisementName()
	_, err = dc.Resource(kubeinventory.AdvertisementResource).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, Limit: 10})
	return err
}
