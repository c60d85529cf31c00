package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

const (
	// malformedObjects is how many unreadable objects the tenant makes:
	// the figure, at which /metrics was 44x larger and /v1/passes
	// 9.3 MB after 32 passes.
	malformedObjects = 5000
	// maxSeriesDelta is how many series the daemon's /metrics may gain (or
	// lose) meanwhile: a label set that appears on the first removal, not
	// one per object.
	maxSeriesDelta = 4
	// maxRSSGrowth bounds the daemon's resident memory growth, settled
	// (settledRSS): the 10 MB. What the objects cost is what the
	// inventory holds of them (about 2 MB: a reference and an interned
	// reason each, none of them in a snapshot) times what the collector
	// lets the heap grow past it: 4 to 5 MiB at the daemon's GC target of
	// 40%, 7 to 10 MiB at Go's default 100%. Before issue 31, a series
	// each and their names in every kept report: 33 MiB.
	maxRSSGrowth = 10 << 20
	// reportBound is what one pass report may weigh apart from the node's
	// own taps (SECURITY.md): its counts and a 10-name sample of the
	// malformed objects, never a list of them. GET /v1/passes serves 8 by
	// default and 32 at most.
	reportBound = 16 << 10
)

// A tenant's unreadable objects must bound what every node spends on them:
// against a cluster whose CRDs validate nothing, 5,000 VPCAttachments and
// BGPAdvertisements that parse to no identity leave /metrics a few series
// apart, the daemon's RSS grown by what caching them costs and no more, and
// GET /v1/passes under its bound; and they do not halt the reclaim of a
// stale tap of an identity none of them could denote. The informers'
// inventory sees every object, malformed ones included: the candidates
// inventory never reads them (admission refuses them, docs/scale.md), so
// the rule this tests is the informers'.
func TestManyMalformedObjectsCostEveryNodeABoundedAmount(t *testing.T) {
	cluster := clustertest.StartUnvalidated(t)
	t.Cleanup(func() { _ = cluster.Env.Stop() })
	cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-1", "a", "1"))
	r := newRemoteNode(t, cluster)
	r.tapAdd("1", "sandbox-1")
	r.start("--inventory", "informers")
	pid := r.daemons[len(r.daemons)-1].Process.Pid
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err != nil || strings.TrimSpace(string(comm)) != "galactic-node" {
		// ip netns exec execs the daemon in its own process: its pid is
		// the daemon's, whose /proc figures are read below.
		t.Fatalf("pid %d is %q (%v), not the daemon", pid, comm, err)
	}

	// Before: two passes run, so that every series a pass makes exists.
	r.force("")
	r.force("")
	scrape := r.metrics()
	seriesBefore, heapBefore := seriesCount(scrape), sampleValue(scrape, "go_memstats_heap_inuse_bytes")
	rssBefore := settledRSS(t, pid)

	start := time.Now()
	if err := makeMalformed(cluster, "tenant-m", malformedObjects); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d malformed objects made in %s", malformedObjects, time.Since(start).Round(time.Millisecond))
	// The metric is set by each pass: force them until a pass has seen
	// every object. Its series are summed, so that the wait ends the same
	// way with one series per object.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r.force("")
		seen := malformedTotal(r.metrics())
		if seen == malformedObjects {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon's passes saw %d of %d malformed objects after 2 min", seen, malformedObjects)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Halting: a stale tap of a/3, an identity none of the objects could
	// denote (their VPC does not read, or it is VPC b), made only now, so
	// that its two passes both ran over the 5,000 objects.
	r.tapAdd("3", "sandbox-3")
	first, second := r.force(""), r.force("")
	if r.exists("G00000000a003H") {
		t.Errorf("the stale tap of a/3 outlived two passes over %d malformed objects:\nfirst %+v\nsecond %+v", malformedObjects, first, second)
	}
	if !r.exists("G00000000a001H") {
		t.Error("the live tap of a/1 was removed")
	}
	// Fill the reclaim's history of 32 reports, each over the 5,000.
	for range 32 {
		r.force("")
	}

	metrics := r.metrics()
	seriesAfter, heapAfter := seriesCount(metrics), sampleValue(metrics, "go_memstats_heap_inuse_bytes")
	rssAfter := settledRSS(t, pid)
	_, peak := rss(t, pid)
	code, body := r.call("GET", "/v1/passes", readToken)
	codeAll, bodyAll := r.call("GET", "/v1/passes?limit=32", readToken)
	// The Go heap in use, from the daemon's own metrics, says how much of
	// the RSS growth is live memory rather than garbage not yet collected.
	t.Logf("series %d -> %d (/metrics %d -> %d bytes); RSS %.1f -> %.1f MiB, peak %.1f MiB (Go heap in use %.1f -> %.1f MiB); GET /v1/passes %d bytes (%d), ?limit=32 %d bytes (%d)",
		seriesBefore, seriesAfter, len(scrape), len(metrics), float64(rssBefore)/(1<<20), float64(rssAfter)/(1<<20), float64(peak)/(1<<20), heapBefore/(1<<20), heapAfter/(1<<20),
		len(body), code, len(bodyAll), codeAll)

	if d := seriesAfter - seriesBefore; d > maxSeriesDelta || d < -maxSeriesDelta {
		t.Errorf("/metrics went from %d to %d series over %d malformed objects, want at most %d apart:\n%s",
			seriesBefore, seriesAfter, malformedObjects, maxSeriesDelta, grepLines(metrics, "galactic_cni_inventory_malformed_objects", 5))
	}
	if rssAfter-rssBefore >= maxRSSGrowth {
		t.Errorf("the daemon's RSS grew by %.1f MiB over %d malformed objects and the passes since, want under %d MiB",
			float64(rssAfter-rssBefore)/(1<<20), malformedObjects, maxRSSGrowth>>20)
	}
	checkPasses := func(query string, code int, body []byte, want int) {
		t.Helper()
		if code != http.StatusOK {
			t.Errorf("GET /v1/passes%s: %d %.300s", query, code, body)
			return
		}
		var out struct {
			Items []struct {
				Inputs map[string]json.RawMessage `json:"inputs"`
			} `json:"items"`
		}
		if err := json.Unmarshal(body, &out); err != nil {
			t.Errorf("GET /v1/passes%s: %v", query, err)
			return
		}
		if len(out.Items) != want {
			t.Errorf("GET /v1/passes%s: %d reports, want %d", query, len(out.Items), want)
		}
		if bound := want * reportBound; len(body) > bound {
			t.Errorf("GET /v1/passes%s is %d bytes for %d reports, bound %d", query, len(body), len(out.Items), bound)
		}
		if len(out.Items) > 0 {
			var sample []string
			_ = json.Unmarshal(out.Items[0].Inputs["malformedSample"], &sample)
			if n := string(out.Items[0].Inputs["malformedObjects"]); n != strconv.Itoa(malformedObjects) || len(sample) == 0 || len(sample) > 10 {
				t.Errorf("GET /v1/passes%s: the newest report counts %q malformed objects and names %d, want %d and 1 to 10",
					query, n, len(sample), malformedObjects)
			}
		}
	}
	checkPasses("", code, body, 8)
	checkPasses("?limit=32", codeAll, bodyAll, 32)
}

// makeMalformed makes n objects in namespace that the daemon cannot read,
// a third each: BGPAdvertisements named not-an-ad-<i> (three segments, not
// <vpc>-<attachment>), VPCAttachments whose status.vpc is "0" (reserved),
// and VPCAttachments of VPC b whose vpcAttachment "zzzzzz" is above 65535.
// None can denote an identity of VPC a. Sixteen at a time, on a client of
// its own without client-side rate limiting (5 a second would take half
// an hour).
func makeMalformed(cluster *clustertest.Cluster, namespace string, n int) error {
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	ctx := context.Background()
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace}}}
	if _, err := client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace %s: %w", namespace, err)
	}
	make1 := func(i int) error {
		var obj *unstructured.Unstructured
		gvr := kubeinventory.AttachmentResource
		switch i % 3 {
		case 0:
			gvr, obj = kubeinventory.AdvertisementResource, clustertest.Advertisement(namespace, fmt.Sprintf("not-an-ad-%d", i), "node-a")
		case 1:
			obj = clustertest.Attachment(namespace, fmt.Sprintf("vpc-zero-%d", i), "0", "1")
		default:
			obj = clustertest.Attachment(namespace, fmt.Sprintf("att-out-of-range-%d", i), "b", "zzzzzz")
		}
		ri := client.Resource(gvr).Namespace(namespace)
		status, hasStatus := obj.Object["status"]
		created, err := ri.Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create %s %s: %w", gvr.Resource, obj.GetName(), err)
		}
		if hasStatus {
			created.Object["status"] = status
			if _, err := ri.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("status of %s %s: %w", gvr.Resource, obj.GetName(), err)
			}
		}
		return nil
	}
	next := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range next {
				if err := make1(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var first error
feed:
	for i := range n {
		select {
		case next <- i:
		case first = <-errs:
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	if first == nil {
		first = <-errs
	}
	return first
}

// seriesCount counts the samples of a scrape: its lines that are not
// comments.
func seriesCount(scrape string) int {
	n := 0
	for l := range strings.Lines(scrape) {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			n++
		}
	}
	return n
}

// malformedTotal sums galactic_cni_inventory_malformed_objects over its
// series, however they are labelled.
func malformedTotal(scrape string) int {
	total := 0.0
	for l := range strings.Lines(scrape) {
		if !strings.HasPrefix(l, "galactic_cni_inventory_malformed_objects") {
			continue
		}
		f := strings.Fields(l)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		total += v
	}
	return int(total)
}

// sampleValue is the value of the unlabelled sample name in scrape, 0 if
// it is missing.
func sampleValue(scrape, name string) float64 {
	for l := range strings.Lines(scrape) {
		if f := strings.Fields(l); len(f) == 2 && f[0] == name {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

// settledRSS is the daemon's resident memory once it stopped moving: the
// largest of ten reads of VmRSS, 1 s apart, that lie within 1 MiB of each
// other (after 90 s, the largest of the last ten, whatever they are).
// Nothing outside the process can make its garbage collector run, and Go
// returns freed heap to the kernel in the background, over seconds: a read
// right after a removing pass counts the garbage of its consistent read of
// the cluster (every object, decoded), which is not kept. Waiting for the
// figure to settle measures what the daemon keeps; taking the largest of
// the ten errs towards more memory, against the test's bound. The peak
// (VmHWM) is logged apart.
func settledRSS(t *testing.T, pid int) int64 {
	t.Helper()
	var reads []int64
	deadline := time.Now().Add(90 * time.Second)
	for {
		now, _ := rss(t, pid)
		reads = append(reads, now)
		if len(reads) > 10 {
			reads = reads[1:]
		}
		if len(reads) == 10 && (slices.Max(reads)-slices.Min(reads) < 1<<20 || time.Now().After(deadline)) {
			return slices.Max(reads)
		}
		time.Sleep(time.Second)
	}
}

// grepLines returns up to n lines of scrape that start with prefix, and
// how many more there were.
func grepLines(scrape, prefix string, n int) string {
	var out []string
	more := 0
	for l := range strings.Lines(scrape) {
		if strings.HasPrefix(l, prefix) {
			if len(out) < n {
				out = append(out, strings.TrimSpace(l))
			} else {
				more++
			}
		}
	}
	return strings.Join(out, "\n") + fmt.Sprintf("\n... and %d more", more)
}
