package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

// Knobs (GALACTICTEST_*, never GALACTIC_*: see README, Conventions).
const (
	envSizes   = "GALACTICTEST_FLEET_SIZES"       // "10x10000,50x10000": nodes x objects
	envProbes  = "GALACTICTEST_FLEET_PROBES"      // objects created, then deleted, one at a time (100)
	envWriters = "GALACTICTEST_FLEET_WRITERS"     // concurrent clients that create the M objects (8)
	envBatch   = "GALACTICTEST_FLEET_START_BATCH" // nodes started (listing) at once (10)
)

// probeNamespace holds the probe objects, so that a node's watch stream
// can be scanned for them cheaply (see tap).
const probeNamespace = "fleet-probe"

// probeVPC is the first VPC of the probes' identities: above any the
// population uses, and too large for an advertisement name's base62 reading,
// so that each probe identity is carried by its probe alone.
const probeVPC = identity.VPC(1 << 40)

type size struct{ nodes, objects int }

// BenchmarkFleet runs, for each size, N simulated nodes against one real
// kube-apiserver and etcd holding M objects (70% VPCAttachments carrying an
// identity in their status, 30% BGPAdvertisements carrying one in their
// name). Each node is the daemon's informer source, kubeinventory.NewCluster,
// over a rest.Config of its own with the daemon's QPS and burst (it sets
// none: client-go's 5 and 10) and a Dial of its own, so that client-go's
// transport cache gives it its own TCP connection and watches, as on a
// real node.
//
// It measures, once per size (b.N is not used: one run takes minutes):
// the API server's and etcd's resident memory (VmRSS, and the API server's
// peak, VmHWM) and CPU (utime+stime from /proc), the heap the nodes add to
// this process after GC divided by N, and for each of the probes, created
// one at a time and then deleted one at a time, the time from the write
// until every node's Snapshot carries it (create) or no longer carries it
// (delete). Snapshots are polled round-robin over the nodes, so those
// figures are upper bounds within one sweep (sweep-ms); the wire figures are
// when the watch event reached the last node's connection, taken from its
// transport, and have no such resolution limit.
func BenchmarkFleet(b *testing.B) {
	for _, s := range sizes(b) {
		b.Run(fmt.Sprintf("nodes=%d/objects=%d", s.nodes, s.objects), func(b *testing.B) { runFleet(b, s) })
		runtime.GC()
	}
}

func sizes(b *testing.B) []size {
	spec := os.Getenv(envSizes)
	if spec == "" {
		spec = "10x10000,50x10000"
	}
	var out []size
	for _, f := range strings.Split(spec, ",") {
		n, m, ok := strings.Cut(strings.TrimSpace(f), "x")
		nodes, err1 := strconv.Atoi(n)
		objects, err2 := strconv.Atoi(m)
		if !ok || err1 != nil || err2 != nil || nodes < 1 || objects < 10 {
			b.Fatalf("%s: %q is not NODESxOBJECTS", envSizes, f)
		}
		out = append(out, size{nodes, objects})
	}
	return out
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s: %q is not a positive integer", name, v)
	}
	return n
}

func runFleet(b *testing.B, s size) {
	probes := envInt(b, envProbes, 100)
	writers := envInt(b, envWriters, 8)
	batch := envInt(b, envBatch, 10)

	cluster := clustertest.Start(b)
	b.Cleanup(func() { _ = cluster.Env.Stop() })
	api := procOf(b, "kube-apiserver", cluster.Env.ControlPlane.APIServer.CertDir)
	etcd := procOf(b, "etcd", cluster.Env.ControlPlane.Etcd.DataDir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The population, written by several clients at once.
	start := time.Now()
	populate(b, cluster.Config, s.objects, writers)
	b.ReportMetric(time.Since(start).Seconds(), "populate-s")
	apiBefore := api.rssMiB()

	// The fleet: nodes start batch by batch, each batch listing at once.
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	apiCPU0 := api.cpuSeconds()
	start = time.Now()
	nodes := make([]*node, s.nodes)
	for i := range nodes {
		nodes[i] = newNode(b, cluster.Config, i)
	}
	for lo := 0; lo < len(nodes); lo += batch {
		group := nodes[lo:min(lo+batch, len(nodes))]
		for _, n := range group {
			n.inv.Start(ctx)
		}
		for _, n := range group {
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Minute)
			ok := n.inv.WaitForSync(wctx)
			wcancel()
			if !ok {
				b.Fatalf("node %d did not sync", n.id)
			}
		}
	}
	syncTime := time.Since(start)
	apiSyncCPU := api.cpuSeconds() - apiCPU0
	wantAtt, wantAdv := split(s.objects)
	for _, n := range nodes {
		snap := n.inv.Snapshot(ctx)
		if err := snap.Healthy(); err != nil || snap.Attachments != wantAtt || snap.Advertisements != wantAdv {
			b.Fatalf("node %d: %d attachments, %d advertisements (want %d, %d): %v", n.id, snap.Attachments, snap.Advertisements, wantAtt, wantAdv, err)
		}
	}
	runtime.GC()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	// Steady state: N nodes watching, nothing changing.
	time.Sleep(5 * time.Second)
	idleCPU0, idleStart := api.cpuSeconds(), time.Now()
	time.Sleep(10 * time.Second)
	apiIdleCPU := (api.cpuSeconds() - idleCPU0) / time.Since(idleStart).Seconds()
	apiRSS, apiPeak, etcdRSS := api.rssMiB(), api.hwmMiB(), etcd.rssMiB()
	conns := established(b, cluster.Config.Host)

	// Probes: created one at a time, then deleted one at a time.
	for _, n := range nodes {
		n.tap.armed.Store(true)
	}
	dc := dynamic.NewForConfigOrDie(ownConfig(cluster.Config, "fleet-probe-writer", 1000, 2000, nil))
	ensureNamespaces(b, dc, []string{probeNamespace})
	apiCPU0 = api.cpuSeconds()
	create := measure(b, ctx, nodes, probes, true, func(i int) { createProbe(b, dc, i) })
	del := measure(b, ctx, nodes, probes, false, func(i int) { deleteProbe(b, dc, i) })
	apiProbeCPU := api.cpuSeconds() - apiCPU0
	cancel()

	perNode := (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(s.nodes) / (1 << 20)
	b.ReportMetric(apiBefore, "api-rss-before-MiB")
	b.ReportMetric(apiRSS, "api-rss-MiB")
	b.ReportMetric(apiPeak, "api-peak-rss-MiB")
	b.ReportMetric(etcdRSS, "etcd-rss-MiB")
	b.ReportMetric(apiSyncCPU, "api-sync-cpu-s")
	b.ReportMetric(100*apiIdleCPU, "api-idle-cpu-%")
	b.ReportMetric(apiProbeCPU, "api-probe-cpu-s")
	b.ReportMetric(syncTime.Seconds(), "sync-s")
	b.ReportMetric(perNode, "node-heap-MiB")
	b.ReportMetric(float64(conns), "api-conns")
	create.report(b, "create")
	del.report(b, "delete")
}

// split is how many of m objects are attachments and advertisements.
func split(m int) (att, adv int) {
	for i := range m {
		if i%10 < 7 {
			att++
		} else {
			adv++
		}
	}
	return att, adv
}

// populated is the i-th object of the population, and its resource.
func populated(i int) (schema.GroupVersionResource, *unstructured.Unstructured) {
	id := identity.Identity{VPC: identity.VPC(1 + i>>16), Attachment: identity.Attachment(i & 0xffff)}
	ns := fmt.Sprintf("fleet-%02d", i%20)
	if i%10 < 7 {
		return kubeinventory.AttachmentResource, clustertest.Attachment(ns, fmt.Sprintf("att-%d", i), id.VPC.Base62(), id.Attachment.Base62())
	}
	return kubeinventory.AdvertisementResource, clustertest.Advertisement(ns, id.AdvertisementName(), fmt.Sprintf("node-%d", i%5000))
}

func populate(b *testing.B, base *rest.Config, m, writers int) {
	var nss []string
	for i := range 20 {
		nss = append(nss, fmt.Sprintf("fleet-%02d", i))
	}
	ensureNamespaces(b, dynamic.NewForConfigOrDie(base), nss)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		dc := dynamic.NewForConfigOrDie(ownConfig(base, fmt.Sprintf("fleet-writer-%d", w), 1000, 2000, nil))
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= m {
					return
				}
				gvr, obj := populated(i)
				if err := write(dc, gvr, obj); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// write creates obj and sets its status, as clustertest.Apply does, from
// any goroutine.
func write(dc dynamic.Interface, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) error {
	ctx := context.Background()
	ri := dc.Resource(gvr).Namespace(obj.GetNamespace())
	status, hasStatus := obj.Object["status"]
	created, err := ri.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create %s %s/%s: %w", gvr.Resource, obj.GetNamespace(), obj.GetName(), err)
	}
	if hasStatus {
		created.Object["status"] = status
		if _, err := ri.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("status of %s %s/%s: %w", gvr.Resource, obj.GetNamespace(), obj.GetName(), err)
		}
	}
	return nil
}

func ensureNamespaces(b *testing.B, dc dynamic.Interface, names []string) {
	for _, name := range names {
		ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}}
		if _, err := dc.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
			b.Fatalf("namespace %s: %v", name, err)
		}
	}
}

// ownConfig copies base with a Dial of its own: client-go's transport cache
// keys on the dialer, so the client gets its own transport, hence its own
// TCP (HTTP/2) connection, as a separate process would.
func ownConfig(base *rest.Config, agent string, qps float32, burst int, wrap func(http.RoundTripper) http.RoundTripper) *rest.Config {
	cfg := rest.CopyConfig(base)
	cfg.UserAgent = agent
	cfg.QPS, cfg.Burst = qps, burst
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	cfg.Dial = d.DialContext
	cfg.WrapTransport = wrap
	return cfg
}

// node is one simulated node: the daemon's informer source and a tap on its
// watch streams.
type node struct {
	id  int
	inv *kubeinventory.Cluster
	tap *tap
}

func newNode(b *testing.B, base *rest.Config, id int) *node {
	t := &tap{seen: map[string]time.Time{}}
	// QPS and Burst 0, as the daemon leaves them: client-go's 5 and 10.
	inv, err := kubeinventory.NewCluster(ownConfig(base, fmt.Sprintf("fleet-node-%d", id), 0, 0, t.wrap), nil)
	if err != nil {
		b.Fatal(err)
	}
	return &node{id: id, inv: inv, tap: t}
}

// probeObject is the i-th probe: 7 in 10 are attachments.
func probeObject(i int) (schema.GroupVersionResource, *unstructured.Unstructured, identity.Identity) {
	id := identity.Identity{VPC: probeVPC + identity.VPC(i), Attachment: 1}
	if i%10 < 7 {
		return kubeinventory.AttachmentResource, clustertest.Attachment(probeNamespace, fmt.Sprintf("probe-%d", i), id.VPC.Base62(), id.Attachment.Base62()), id
	}
	return kubeinventory.AdvertisementResource, clustertest.Advertisement(probeNamespace, id.AdvertisementName(), "node-probe"), id
}

func createProbe(b *testing.B, dc dynamic.Interface, i int) {
	gvr, obj, _ := probeObject(i)
	if err := write(dc, gvr, obj); err != nil {
		b.Error(err)
	}
}

func deleteProbe(b *testing.B, dc dynamic.Interface, i int) {
	gvr, obj, _ := probeObject(i)
	if err := dc.Resource(gvr).Namespace(probeNamespace).Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}); err != nil {
		b.Error(err)
	}
}

// latencies are one phase's figures, in milliseconds.
type latencies struct {
	snapshot, wire []float64
	sweeps         []float64
}

func (l latencies) report(b *testing.B, phase string) {
	b.ReportMetric(percentile(l.snapshot, 50), phase+"-p50-ms")
	b.ReportMetric(percentile(l.snapshot, 99), phase+"-p99-ms")
	b.ReportMetric(percentile(l.wire, 50), phase+"-wire-p50-ms")
	b.ReportMetric(percentile(l.wire, 99), phase+"-wire-p99-ms")
	b.ReportMetric(percentile(l.sweeps, 50), phase+"-sweep-ms")
}

func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(p/100*float64(len(s))))-1)]
}

// measure does act(i) for each probe, one every 20 ms, while a sweeper
// takes every node's Snapshot in turn, and returns, for each probe, the time
// from the start of its write until the last node's Snapshot carried it
// (create) or no longer did (delete), and until its watch event reached the
// last node's connection.
func measure(b *testing.B, ctx context.Context, nodes []*node, probes int, create bool, act func(int)) latencies {
	sent := make([]atomic.Int64, probes) // unix nanoseconds; 0 = not yet
	done := make([][]int64, len(nodes))  // [node][probe] unix nanoseconds the node's Snapshot agreed
	for j := range done {
		done[j] = make([]int64, probes)
	}
	ids := make([]identity.Identity, probes)
	names := make([]string, probes)
	for i := range probes {
		_, obj, id := probeObject(i)
		ids[i], names[i] = id, obj.GetName()
	}
	var sweeps []float64
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		deadline := time.Now().Add(10 * time.Minute)
		for left := len(nodes) * probes; left > 0; {
			if time.Now().After(deadline) || ctx.Err() != nil {
				b.Errorf("%d (node, probe) pairs never agreed", left)
				return
			}
			t0 := time.Now()
			for j, n := range nodes {
				snap := n.inv.Snapshot(ctx)
				now := time.Now().UnixNano()
				for i := range probes {
					if done[j][i] != 0 || sent[i].Load() == 0 {
						continue
					}
					if snap.Carried(ids[i]) == create {
						done[j][i] = now
						left--
					}
				}
			}
			sweeps = append(sweeps, float64(time.Since(t0).Microseconds())/1000)
			if left > 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	for i := range probes {
		sent[i].Store(time.Now().UnixNano())
		act(i)
		time.Sleep(20 * time.Millisecond)
	}
	<-finished
	var l latencies
	l.sweeps = sweeps
	kind := "C/"
	if !create {
		kind = "D/"
	}
	for i := range probes {
		var last, lastWire int64
		wireOK := true
		for j, n := range nodes {
			last = max(last, done[j][i])
			w, ok := n.tap.at(kind + names[i])
			wireOK = wireOK && ok
			lastWire = max(lastWire, w.UnixNano())
		}
		s := sent[i].Load()
		l.snapshot = append(l.snapshot, float64(last-s)/1e6)
		if wireOK {
			l.wire = append(l.wire, float64(lastWire-s)/1e6)
		}
	}
	if len(l.wire) < probes {
		b.Logf("%d of %d probes' watch events were not seen on every node's connection", probes-len(l.wire), probes)
	}
	return l
}

// tap notes when a probe's watch event reaches a node's connection: it
// wraps the node's transport and scans the bodies of its watch responses,
// line by line (one JSON event a line), once armed; before that it only
// passes the bytes on.
type tap struct {
	armed atomic.Bool
	mu    sync.Mutex
	seen  map[string]time.Time // "C/name" carried, "D/name" deleted
}

func (t *tap) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil && req.URL.Query().Get("watch") == "true" {
			resp.Body = &tapBody{ReadCloser: resp.Body, tap: t, aligned: true}
		}
		return resp, err
	})
}

func (t *tap) at(key string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.seen[key]
	return at, ok
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type tapBody struct {
	io.ReadCloser
	tap     *tap
	buf     []byte
	aligned bool // buf starts at an event's first byte
}

var probeMarker = []byte(`"namespace":"` + probeNamespace + `"`)

func (b *tapBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if !b.tap.armed.Load() {
		// Only keep track of whether the next byte starts an event.
		if n > 0 {
			b.aligned = p[n-1] == '\n'
		}
		b.buf = b.buf[:0]
		return n, err
	}
	now := time.Now()
	b.buf = append(b.buf, p[:n]...)
	for {
		i := bytes.IndexByte(b.buf, '\n')
		if i < 0 {
			break
		}
		line := b.buf[:i]
		if b.aligned && bytes.Contains(line, probeMarker) {
			b.note(line, now)
		}
		b.aligned = true
		b.buf = b.buf[i+1:]
	}
	b.buf = slices.Clip(b.buf)
	return n, err
}

func (b *tapBody) note(line []byte, now time.Time) {
	var ev struct {
		Type   string `json:"type"`
		Object struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Status struct {
				VPC string `json:"vpc"`
			} `json:"status"`
		} `json:"object"`
	}
	if json.Unmarshal(line, &ev) != nil {
		return
	}
	var key string
	switch {
	case ev.Type == "DELETED":
		key = "D/" + ev.Object.Metadata.Name
	case (ev.Type == "ADDED" || ev.Type == "MODIFIED") && (ev.Object.Kind == "BGPAdvertisement" || ev.Object.Status.VPC != ""):
		key = "C/" + ev.Object.Metadata.Name
	default:
		return
	}
	b.tap.mu.Lock()
	if _, ok := b.tap.seen[key]; !ok {
		b.tap.seen[key] = now
	}
	b.tap.mu.Unlock()
}

// proc is a process of the cluster, read from /proc.
type proc struct {
	b   *testing.B
	pid int
}

// procOf finds the cluster's process whose binary is named bin and whose
// command line names dir (the API server's certificate folder, etcd's data
// folder).
func procOf(b *testing.B, bin, dir string) proc {
	pid, err := clustertest.ProcessOf(bin, dir)
	if err != nil {
		b.Fatal(err)
	}
	return proc{b, pid}
}

func (p proc) status(field string) float64 {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.pid), "status"))
	if err != nil {
		p.b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	p.b.Fatalf("no %s in /proc/%d/status", field, p.pid)
	return 0
}

func (p proc) rssMiB() float64 { return p.status("VmRSS") }
func (p proc) hwmMiB() float64 { return p.status("VmHWM") }

// cpuSeconds is the process's utime+stime.
func (p proc) cpuSeconds() float64 {
	cpu, err := clustertest.CPUSeconds(p.pid)
	if err != nil {
		p.b.Fatal(err)
	}
	return cpu
}

// established counts the TCP connections established to the API server, as
// its side sees them: one per client transport.
func established(b *testing.B, host string) int {
	u, err := url.Parse(host)
	if err != nil {
		b.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		b.Fatalf("API server port of %s: %v", host, err)
	}
	want := fmt.Sprintf(":%04X", port)
	count := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) > 3 && strings.HasSuffix(fs[1], want) && fs[3] == "01" {
				count++
			}
		}
	}
	return count
}
