package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

const envReadCostObjects = "GALACTICTEST_READCOST_OBJECTS" // M objects, BenchmarkFleet's population (2000)

// BenchmarkReadCost measures what each read a node can make costs the API
// server, one read at a time, against one real kube-apiserver and etcd
// holding M objects (BenchmarkFleet's population): the API server's
// CPU-milliseconds a read (utime+stime from /proc), net of what it burns
// idle over the same time (measured before, with no client), and the wall
// time a read. The fleet's per-node figures are sums of these plus their
// share of the idle; this says which read to make cheaper.
//
// The reads: the candidates' per-identity reads for an identity nothing
// carries (the removing pass's case, where a scan finds nothing and so
// cannot stop early), their health and size reads, a consistent GET of
// one object by key (which the API server serves from etcd, not from its
// watch cache: k8s.io/apiserver pkg/storage/cacher/delegator.go, Get with
// no resourceVersion), and the informers' consistent read of everything
// as the peer.
func BenchmarkReadCost(b *testing.B) {
	m := envInt(b, envReadCostObjects, 2000)
	cluster := clustertest.StartWith(b, func(a *envtest.APIServer) { a.Configure().Set("request-timeout", "60s") })
	b.Cleanup(func() { _ = cluster.Env.Stop() })
	populate(b, cluster.Config, m, envInt(b, envWriters, 8))
	api := procOf(b, "kube-apiserver", cluster.Env.ControlPlane.APIServer.CertDir)
	etcd := procOf(b, "etcd", cluster.Env.ControlPlane.Etcd.DataDir)
	hc, err := rest.HTTPClientFor(cluster.Config)
	if err != nil {
		b.Fatal(err)
	}
	host := strings.TrimSuffix(cluster.Config.Host, "/")

	// Let the writes' aftermath (watch cache, etcd compaction of nothing,
	// GC of the populate's garbage) settle, then weigh the idle.
	time.Sleep(5 * time.Second)
	cpu0, ecpu0, t0 := api.cpuSeconds(), etcd.cpuSeconds(), time.Now()
	time.Sleep(15 * time.Second)
	idlePerSec := (api.cpuSeconds() - cpu0) / time.Since(t0).Seconds()
	etcdIdlePerSec := (etcd.cpuSeconds() - ecpu0) / time.Since(t0).Seconds()
	b.Logf("%d objects; idle: API server %.2f%%, etcd %.2f%% of a core", m, idlePerSec*100, etcdIdlePerSec*100)

	stale := identity.Identity{VPC: probeVPC, Attachment: 1}
	list := func(gvr schema.GroupVersionResource, q url.Values) string {
		return fmt.Sprintf("%s/apis/%s/%s/%s?%s", host, gvr.Group, gvr.Version, gvr.Resource, q.Encode())
	}
	key := func(gvr schema.GroupVersionResource, ns, name string) string {
		return fmt.Sprintf("%s/apis/%s/%s/namespaces/%s/%s/%s", host, gvr.Group, gvr.Version, ns, gvr.Resource, name)
	}
	_, existing := populated(0)
	// The resourceVersion of a consistent read now, for the reads that
	// ask for "at least this new" instead of asking etcd for its revision.
	rv := currentRV(b, hc, list(kubeinventory.AttachmentResource, url.Values{"limit": {"1"}}))
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	reads := []struct {
		name  string
		url   string
		ok    []int
		every bool // follow the continue tokens to the end
	}{
		{"attachments-by-identity-none", list(kubeinventory.AttachmentResource, url.Values{"limit": {"10"},
			"fieldSelector": {kubeinventory.FieldVPC + "=" + stale.VPC.Base62() + "," + kubeinventory.FieldAttachment + "=" + stale.Attachment.Base62()}}), []int{200}, false},
		{"advertisements-by-name-none", list(kubeinventory.AdvertisementResource, url.Values{"limit": {"10"},
			"fieldSelector": {"metadata.name=" + stale.AdvertisementName()}}), []int{200}, false},
		{"health-limit-1", list(kubeinventory.AttachmentResource, url.Values{"limit": {"1"},
			"fieldSelector": {kubeinventory.FieldVPC + "!=," + kubeinventory.FieldAttachment + "!="}}), []int{200}, false},
		{"size-limit-1", list(kubeinventory.AttachmentResource, url.Values{"limit": {"1"}}), []int{200}, false},
		{"size-limit-1-not-older-than-rv", list(kubeinventory.AttachmentResource, url.Values{"limit": {"1"},
			"resourceVersion": {rv}, "resourceVersionMatch": {"NotOlderThan"}}), []int{200}, false},
		{"size-limit-1-one-namespace", fmt.Sprintf("%s/apis/%s/%s/namespaces/%s/%s?limit=1", host, kubeinventory.AttachmentResource.Group,
			kubeinventory.AttachmentResource.Version, existing.GetNamespace(), kubeinventory.AttachmentResource.Resource), []int{200}, false},
		{"crd-by-name", list(crds, url.Values{"limit": {"1"}, "fieldSelector": {"metadata.name=" + kubeinventory.AttachmentResource.GroupResource().String()}}), []int{200}, false},
		{"get-by-key-existing", key(kubeinventory.AttachmentResource, existing.GetNamespace(), existing.GetName()), []int{200}, false},
		{"get-by-key-absent", key(kubeinventory.AttachmentResource, existing.GetNamespace(), "no-such-attachment"), []int{404}, false},
		{"informers-read-of-everything", list(kubeinventory.AttachmentResource, url.Values{"limit": {"500"}}), []int{200}, true},
	}
	for _, r := range reads {
		b.Run("read="+r.name, func(b *testing.B) {
			var bytes int64
			cpu0, ecpu0, t0 := api.cpuSeconds(), etcd.cpuSeconds(), time.Now()
			for b.Loop() {
				n, err := readAll(b.Context(), hc, r.url, r.ok, r.every)
				if err != nil {
					b.Fatal(err)
				}
				bytes += n
			}
			wall := time.Since(t0)
			cpu := api.cpuSeconds() - cpu0
			net := cpu - idlePerSec*wall.Seconds()
			b.ReportMetric(cpu/float64(b.N)*1000, "api-cpu-ms/read")
			b.ReportMetric(net/float64(b.N)*1000, "net-api-cpu-ms/read")
			b.ReportMetric(float64(bytes)/float64(b.N), "B/read")
			enet := etcd.cpuSeconds() - ecpu0 - etcdIdlePerSec*wall.Seconds()
			b.ReportMetric(enet/float64(b.N)*1000, "net-etcd-cpu-ms/read")
		})
	}
}

// currentRV is the resourceVersion of the list at u.
func currentRV(b *testing.B, hc *http.Client, u string) string {
	resp, err := hc.Get(u)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || l.Metadata.ResourceVersion == "" {
		b.Fatalf("resourceVersion of %s: %v", u, err)
	}
	return l.Metadata.ResourceVersion
}

// readAll sends a GET of u and reads its answer whole; with every, it
// follows the list's continue tokens to the end, as a paginated consistent
// read of every object does. It returns the bytes read.
func readAll(ctx context.Context, hc *http.Client, u string, ok []int, every bool) (int64, error) {
	var total int64
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return total, err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return total, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		total += int64(len(body))
		if err != nil {
			return total, err
		}
		if !slices.Contains(ok, resp.StatusCode) {
			return total, fmt.Errorf("GET %s: %s: %.200s", u, resp.Status, body)
		}
		if !every {
			return total, nil
		}
		_, after, found := strings.Cut(string(body), `"continue":"`)
		cont, _, _ := strings.Cut(after, `"`)
		if !found || cont == "" {
			return total, nil
		}
		pu, err := url.Parse(u)
		if err != nil {
			return total, err
		}
		q := pu.Query()
		q.Set("continue", cont)
		pu.RawQuery = q.Encode()
		u = pu.String()
	}
}
