package hubctl_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/ipamtest"
)

func TestMain(m *testing.M) { os.Exit(clustertest.Main(m)) }

const quotaResource = "count/ipclaims.ipam.miloapis.com"

// standIn is the address service, standing in for the real one in the test
// process: it binds each new claim to an allocation named after it with the
// claim's policy recorded, holds a finalizer on claims so that deleting one
// keeps a Retain allocation (claimRef cleared) and deletes the others, and
// recounts the quota's usage, which nothing else does without
// kube-controller-manager.
type standIn struct {
	dyn  dynamic.Interface
	cs   kubernetes.Interface
	ns   string
	mu   sync.Mutex
	next int
}

const finalizer = "ipam.miloapis.com/allocation"

func (s *standIn) run(ctx context.Context, t testing.TB) {
	for {
		if err := s.step(ctx); err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			t.Logf("address service stand-in: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *standIn) step(ctx context.Context) error {
	claims := s.dyn.Resource(hubctl.ClaimResource).Namespace(s.ns)
	allocs := s.dyn.Resource(hubctl.AllocationResource).Namespace(s.ns)
	list, err := claims.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range list.Items {
		c := &list.Items[i]
		allocName := hubctl.AllocationName(s.ns, c.GetName())
		if c.GetDeletionTimestamp() != nil {
			if a, err := allocs.Get(ctx, allocName, metav1.GetOptions{}); err == nil {
				if policy, _, _ := unstructured.NestedString(a.Object, "spec", "reclaimPolicy"); policy == hubctl.PolicyRetain {
					unstructured.RemoveNestedField(a.Object, "spec", "claimRef")
					if _, err := allocs.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
						return err
					}
				} else if err := allocs.Delete(ctx, allocName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
			c.SetFinalizers(nil)
			if _, err := claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
				return err
			}
			continue
		}
		if phase, _, _ := unstructured.NestedString(c.Object, "status", "phase"); phase == "Bound" {
			continue
		}
		if len(c.GetFinalizers()) == 0 {
			c.SetFinalizers([]string{finalizer})
			if c, err = claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		policy, _, _ := unstructured.NestedString(c.Object, "spec", "reclaimPolicy")
		if policy == "" {
			policy = hubctl.PolicyDelete
		}
		s.mu.Lock()
		s.next++
		block := fmt.Sprintf("fd00:0:%x:%x::/64", s.next>>16, s.next&0xffff)
		s.mu.Unlock()
		a := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPAllocation",
			"metadata": map[string]any{"namespace": s.ns, "name": allocName},
			"spec":     map[string]any{"claimRef": map[string]any{"name": c.GetName()}, "reclaimPolicy": policy},
		}}
		created, err := allocs.Create(ctx, a, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Object["status"] = map[string]any{"phase": "Bound", "allocatedCIDR": block}
		if _, err := allocs.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return err
		}
		c.Object["status"] = map[string]any{"phase": "Bound", "allocatedCIDR": block, "boundAllocationRef": map[string]any{"name": allocName}}
		if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return s.recount(ctx, func() (int, error) {
		fresh, err := claims.List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		return len(fresh.Items), nil
	})
}

// recount writes the number of claims count finds as the quota's usage.
// The quota is read first and written with that read's resourceVersion:
// a claim the quota admits after the read raises its usage and changes its
// version, so a count that may predate that claim fails with a conflict
// instead of lowering the usage and letting one claim too many in.
func (s *standIn) recount(ctx context.Context, count func() (int, error)) error {
	rqs := s.cs.CoreV1().ResourceQuotas(s.ns)
	list, err := rqs.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	used, err := count()
	if err != nil {
		return err
	}
	for i := range list.Items {
		rq := &list.Items[i]
		want := resource.MustParse(fmt.Sprint(used))
		if got, ok := rq.Status.Used[quotaResource]; ok && got.Cmp(want) == 0 && rq.Status.Hard != nil {
			continue
		}
		rq.Status.Hard = rq.Spec.Hard
		rq.Status.Used = corev1.ResourceList{quotaResource: want}
		if _, err := rqs.UpdateStatus(ctx, rq, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

type hub struct {
	cluster *clustertest.Cluster
	dyn     dynamic.Interface
	cs      kubernetes.Interface
	ns      string
	// ctlCfg, when set, is the controllers' client configuration: the
	// benchmarks give it the hub's default client rate, and the tests
	// against the ipam-shaped service point it at that service.
	ctlCfg *rest.Config
	// requests counts the HTTP requests the controllers make through
	// ctlCfg (watches once, when they start), when atHubRate set it;
	// eventWrites, apart, the Events they write (one per release, in the
	// background).
	requests, eventWrites atomic.Int64
}

// atHubRate makes the controllers started after it use clients limited to
// the command's default --kube-api-qps and --kube-api-burst, and counts
// their requests.
func (h *hub) atHubRate(t testing.TB) {
	t.Helper()
	base := h.cluster.Config
	if h.ctlCfg != nil {
		base = h.ctlCfg
	}
	cfg := hubRate(base)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countedTrips{rt, &h.requests, &h.eventWrites} }
	h.ctlCfg = cfg
}

// hubRate is cfg at the command's default client rate.
func hubRate(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = hubctl.DefaultKubeAPIQPS, hubctl.DefaultKubeAPIBurst
	return cfg
}

// countedTrips counts the round trips through it: writes of Events in
// events, every other request in n.
type countedTrips struct {
	rt     http.RoundTripper
	n      *atomic.Int64
	events *atomic.Int64
}

func (c countedTrips) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.events != nil && isEventWrite(r) {
		c.events.Add(1)
	} else {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// isEventWrite: a create (POST …/events) or a series patch (PATCH
// …/events/<name>) of an Event, in either API group.
func isEventWrite(r *http.Request) bool {
	dir, last := path.Split(r.URL.Path)
	switch r.Method {
	case http.MethodPost:
		return last == "events"
	case http.MethodPatch, http.MethodPut:
		return path.Base(dir) == "events"
	}
	return false
}

// clients are a controller's: one REST client (its requests share one
// rate limiter, as the command's do) and a clientset for events and the
// Lease.
func (h *hub) clients(t testing.TB) (rest.Interface, kubernetes.Interface) {
	t.Helper()
	cfg := h.cluster.Config
	if h.ctlCfg != nil {
		cfg = h.ctlCfg
	}
	rc, err := hubctl.NewRESTClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rc, cs
}

// newHub prepares a platform namespace with a quota of quota claims and the
// address service stand-in running.
func newHub(t testing.TB, quota int) *hub { return newHubWith(t, quota, true) }

func newHubWith(t testing.TB, quota int, addressService bool) *hub {
	t.Helper()
	cluster := clustertest.Shared(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	h := &hub{cluster: cluster, dyn: cluster.Client, cs: cs, ns: fmt.Sprintf("platform-%d", time.Now().UnixNano()%1e9)}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ResourceQuotas(h.ns).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "claims"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{quotaResource: resource.MustParse(fmt.Sprint(quota))}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &standIn{dyn: h.dyn, cs: cs, ns: h.ns}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if addressService {
		go s.run(ctx, t)
	} else if err := s.recount(ctx, func() (int, error) { return 0, nil }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the quota's status", func() bool {
		rq, err := cs.CoreV1().ResourceQuotas(h.ns).Get(ctx, "claims", metav1.GetOptions{})
		return err == nil && rq.Status.Hard != nil
	})
	return h
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *hub) network(t testing.TB, ns, name string) {
	t.Helper()
	t.Cleanup(func() {
		h.cluster.Delete(t, hubctl.NetworkResource, ns, name)
		h.cluster.Delete(t, hubctl.FabricIdentityResource, ns, name)
		h.cluster.Delete(t, hubctl.PolicyResource, "", hubctl.PolicyName(ns, name))
	})
	h.cluster.Apply(t, hubctl.NetworkResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.datumapis.com/v1alpha", "kind": "Network",
		"metadata": map[string]any{"namespace": ns, "name": name}, "spec": map[string]any{},
	}})
}

// touch changes a network's labels, so that the network informer requeues it.
func (h *hub) touch(t testing.TB, ns, name string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"touched":"%d"}}}`, time.Now().UnixNano())
	if _, err := h.dyn.Resource(hubctl.NetworkResource).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("touch %s/%s: %v", ns, name, err)
	}
}

func (h *hub) identity(ns, name string) (int64, bool) {
	u, err := h.dyn.Resource(hubctl.FabricIdentityResource).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return 0, false
	}
	id, _, _ := unstructured.NestedInt64(u.Object, "spec", "identity")
	return id, true
}

type instance struct {
	ctl         *hubctl.Controller
	metrics     *hubctl.Metrics
	networks    *hubctl.NetworkInformer
	claims      *hubctl.ClaimInformer
	allocations *hubctl.AllocationInformer
	identities  *hubctl.FabricIdentityInformer
	placement   *hubctl.PlacementInformers
	ctx         context.Context
	cancel      context.CancelFunc
	done        chan struct{}
	running     sync.WaitGroup
}

// start runs a controller; with lease set it campaigns for that Lease and
// acts only as leader.
func (h *hub) start(t testing.TB, id, lease string) *instance {
	t.Helper()
	return h.startWith(t, id, lease, nil)
}

// startWith is start with the controller's Config adjusted by tune.
func (h *hub) startWith(t testing.TB, id, lease string, tune func(*hubctl.Config)) *instance {
	t.Helper()
	return h.startOpts(t, id, lease, startOpts{tune: tune})
}

// startOpts are the seams of a test's controller, all in the test: the
// product has none of them.
type startOpts struct {
	tune func(*hubctl.Config)
	// api wraps the API the controller is given (and the fence then wraps).
	api func(hubctl.API) hubctl.API
	// identities wraps the identity cache the controller reads.
	identities func(hubctl.IdentityCache) hubctl.IdentityCache
	// identityChanged, when set, is called in place of the controller's
	// IdentityChanged, with it as next.
	identityChanged func(ns, name string, next func(ns, name string))
	// manual: the informers run and the controller is built, but the test
	// calls it (Sweep, Reconcile, run) itself.
	manual bool
	// relist is the claim and allocation informers' relist interval.
	relist time.Duration
	// placementAPI wraps the API placement is given (and the fence then
	// wraps); noPlacement runs the controller with NoPlacement.
	placementAPI func(hubctl.PlacementAPI) hubctl.PlacementAPI
	noPlacement  bool
	// placementCache wraps the caches placement reads.
	placementCache func(hubctl.PlacementCache) hubctl.PlacementCache
}

// startOpts runs a controller as the command wires it: informers over
// networks, claims, allocations and fabric identities, their caches in its
// Config, run once they have synced.
func (h *hub) startOpts(t testing.TB, id, lease string, o startOpts) *instance {
	t.Helper()
	m, err := hubctl.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{metrics: m, done: make(chan struct{})}
	rc, cs := h.clients(t)
	kube := hubctl.NewKube(rc, cs, h.ns, "galactic-hubctl-test")
	t.Cleanup(kube.Shutdown)
	dyn := kube.Dynamic()
	if in.networks, err = hubctl.NewNetworkInformer(dyn, func(ns, name string) { in.ctl.Enqueue(ns, name) }); err != nil {
		t.Fatal(err)
	}
	if in.claims, err = hubctl.NewClaimInformer(dyn, h.ns, hubctl.ClaimEvents{
		Bound: func(ns, name string) { in.ctl.ClaimBound(ns, name) },
		Gone:  func() { in.ctl.ClaimGone() },
	}, o.relist); err != nil {
		t.Fatal(err)
	}
	if in.allocations, err = hubctl.NewAllocationInformer(dyn, h.ns, o.relist); err != nil {
		t.Fatal(err)
	}
	identityChanged := func(ns, name string) { in.ctl.IdentityChanged(ns, name) }
	if o.identityChanged != nil {
		identityChanged = func(ns, name string) { o.identityChanged(ns, name, in.ctl.IdentityChanged) }
	}
	if in.identities, err = hubctl.NewFabricIdentityInformer(dyn, identityChanged); err != nil {
		t.Fatal(err)
	}
	cfg := hubctl.Config{PlatformNamespace: h.ns, BaseDelay: 50 * time.Millisecond, MaxDelay: time.Second,
		Claims: in.claims, Allocations: in.allocations, Identities: in.identities}
	if o.identities != nil {
		cfg.Identities = o.identities(in.identities)
	}
	if o.tune != nil {
		o.tune(&cfg)
	}
	var api hubctl.API = kube
	if o.api != nil {
		api = o.api(kube)
	}
	var place hubctl.Placement = hubctl.NoPlacement{}
	placementSynced := func() bool { return true }
	if !o.noPlacement {
		var placer *hubctl.Placer
		if in.placement, err = hubctl.NewPlacementInformers(dyn, in.networks, in.identities, hubctl.PlacementEvents{
			Context: func(ns, name string) { in.ctl.ContextChanged(ns, name) },
			Policy: func(ns, name string, present bool) {
				if !present {
					placer.PolicyGone(hubctl.Key{Namespace: ns, Name: name})
				}
				in.ctl.PolicyChanged(ns, name, present)
			},
		}); err != nil {
			t.Fatal(err)
		}
		var papi hubctl.PlacementAPI = kube
		if o.placementAPI != nil {
			papi = o.placementAPI(kube)
		}
		var pcache hubctl.PlacementCache = in.placement
		if o.placementCache != nil {
			pcache = o.placementCache(in.placement)
		}
		placer = hubctl.NewPlacer(papi, pcache, cfg.Fence, m, testLog())
		place, placementSynced = placer, in.placement.HasSynced
	}
	in.ctl = hubctl.New(api, in.networks, place, m, testLog(), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	in.ctx, in.cancel = ctx, cancel
	go in.networks.Run(ctx)
	go in.claims.Run(ctx)
	go in.allocations.Run(ctx)
	go in.identities.Run(ctx)
	if in.placement != nil {
		go in.placement.Run(ctx)
	}
	synced := func(ctx context.Context) bool {
		return cache.WaitForCacheSync(ctx.Done(), in.networks.HasSynced, in.claims.HasSynced, in.allocations.HasSynced, in.identities.HasSynced,
			placementSynced)
	}
	run := func(ctx context.Context) {
		if synced(ctx) {
			in.ctl.Run(ctx)
		}
	}
	go func() {
		defer close(in.done)
		switch {
		case o.manual:
			synced(ctx)
		case lease == "":
			run(ctx)
		default:
			timing := hubctl.LeaseTiming{Duration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond}
			if err := hubctl.RunAsLeader(ctx, cs, h.ns, lease, id, timing, run); err != nil {
				t.Error(err)
			}
		}
	}()
	t.Cleanup(in.stop)
	if o.manual {
		<-in.done
	}
	return in
}

// run runs a manual instance's controller, sweep and workers, until it
// stops.
func (in *instance) run() {
	in.running.Go(func() { in.ctl.Run(in.ctx) })
}

func (in *instance) stop() {
	in.cancel()
	<-in.done
	in.running.Wait()
}

// TestAGoneNetworkGivesItsQuotaUnitBackOnARealAPIServer: with a real
// ResourceQuota of one claim, B is refused with a real 403 while A holds the
// unit, and admitted once A is gone; A's block stays retained.
func TestAGoneNetworkGivesItsQuotaUnitBackOnARealAPIServer(t *testing.T) {
	h := newHub(t, 1)
	in := h.start(t, "", "")
	h.network(t, "team-a", "net-a")
	waitFor(t, "A's identity", func() bool { _, ok := h.identity("team-a", "net-a"); return ok })
	idA, _ := h.identity("team-a", "net-a")

	h.network(t, "team-a", "net-b")
	waitFor(t, "B refused by the quota", func() bool { return testutil.ToFloat64(quotaRefusals(in.metrics)) >= 2 })
	if _, ok := h.identity("team-a", "net-b"); ok {
		t.Fatal("B got an identity while the quota was full")
	}
	events, _ := h.cs.CoreV1().Events("team-a").List(context.Background(), metav1.ListOptions{})
	found := false
	for _, e := range events.Items {
		found = found || (e.Reason == "FabricIdentityQuotaExceeded" && e.InvolvedObject.Name == "net-b")
	}
	if !found {
		t.Error("no quota event on network B")
	}

	h.cluster.Delete(t, hubctl.NetworkResource, "team-a", "net-a")
	waitFor(t, "B's identity after A's release", func() bool { _, ok := h.identity("team-a", "net-b"); return ok })
	idB, _ := h.identity("team-a", "net-b")
	if idB == idA {
		t.Fatalf("B got A's identity %d: A's block was reissued", idA)
	}
	if _, ok := h.identity("team-a", "net-a"); ok {
		t.Fatal("the gone network's identity is still there")
	}
	alloc, err := h.dyn.Resource(hubctl.AllocationResource).Namespace(h.ns).Get(context.Background(),
		hubctl.AllocationName(h.ns, hubctl.ClaimName("team-a", "net-a")), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("A's allocation: %v; want it retained", err)
	}
	if ref, _, _ := unstructured.NestedString(alloc.Object, "spec", "claimRef", "name"); ref != "" {
		t.Fatalf("A's allocation still names claim %q", ref)
	}
}

func quotaRefusals(m *hubctl.Metrics) prometheus.Collector { return hubctl.QuotaRefusals(m) }

// TestOnlyTheLeaderActsAndStoppingItHandsOver runs two instances on one
// Lease: the leader alone writes identities; stopped, it releases the Lease
// and the other continues.
func TestOnlyTheLeaderActsAndStoppingItHandsOver(t *testing.T) {
	h := newHub(t, 10)
	one := h.start(t, "one", "galactic-hubctl")
	waitFor(t, "one leading", func() bool { return holder(t, h) == "one" })
	two := h.start(t, "two", "galactic-hubctl")
	h.network(t, "team-b", "first")
	waitFor(t, "the first identity", func() bool { _, ok := h.identity("team-b", "first"); return ok })
	time.Sleep(300 * time.Millisecond)
	if w1, w2 := written(one), written(two); w1 != 1 || w2 != 0 {
		t.Fatalf("identities written: leader %v, follower %v; want 1 and 0", w1, w2)
	}

	one.stop()
	waitFor(t, "two leading", func() bool { return holder(t, h) == "two" })
	h.network(t, "team-b", "second")
	waitFor(t, "the second identity", func() bool { _, ok := h.identity("team-b", "second"); return ok })
	// The identity is visible a moment before the writer counts it.
	waitFor(t, "the new leader to count its write", func() bool { return written(two) == 1 })
	if w1 := written(one); w1 != 1 {
		t.Fatalf("the stopped leader wrote %v identities in all, want 1", w1)
	}
}

func written(in *instance) float64 { return testutil.ToFloat64(hubctl.IdentitiesWritten(in.metrics)) }

func holder(t testing.TB, h *hub) string {
	l, err := h.cs.CoordinationV1().Leases(h.ns).Get(context.Background(), "galactic-hubctl", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// seedGoneClaims creates n bound fabric-identity claims with Retain
// allocations for networks that do not exist, as a hub left with n gone
// networks would be. No finalizers: the release and the peer delete alike
// remove the claim at once.
func (h *hub) seedGoneClaims(b testing.TB, n int, round int) []string {
	b.Helper()
	ctx := context.Background()
	claims := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns)
	allocs := h.dyn.Resource(hubctl.AllocationResource).Namespace(h.ns)
	names := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		names[i] = hubctl.ClaimName("gone", fmt.Sprintf("net-%d-%d", round, i))
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			alloc := hubctl.AllocationName(h.ns, names[i])
			_, err := allocs.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPAllocation",
				"metadata": map[string]any{"namespace": h.ns, "name": alloc},
				"spec":     map[string]any{"claimRef": map[string]any{"name": names[i]}, "reclaimPolicy": "Retain"},
			}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				b.Error(err)
				return
			}
			_, err = claims.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPClaim",
				"metadata": map[string]any{"namespace": h.ns, "name": names[i]},
				"spec":     map[string]any{"ipFamily": "IPv6", "prefixLength": int64(64), "reclaimPolicy": "Retain"},
			}}, metav1.CreateOptions{})
			if err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	return names
}

// BenchmarkRelease1000ClaimsOfGoneNetworks times the controller releasing
// the claims of 1,000 gone networks against bare client-go deletes of
// 1,000 such claims in the same run, both at the hub's default client rate
// (50/s, burst 100): sweep, by the startup sweep (one LIST of networks, a
// delete per claim); workers, by the workers, each network queued as its
// informer would queue it (batched LISTs confirming them gone, a delete per
// claim). The controller's informers hold the claims and allocations
// before the clock starts, as they do on a running hub. requests/release
// counts every HTTP request of the controller's clients in the window.
//
// The ipam/ variants reach the claims through the ipam-shaped service
// (test/framework/ipamtest), whose deletes answer the claim deleted: the check
// after each delete reads that answer, and the peer's bare deletes go
// through the same service.
//
// The placed/sweep variant gives each gone network a placement policy too,
// as a hub placing with Karmada leaves them: each collect is then the
// claim's release and the policy's delete, and the peer deletes both. There
// is no placed/workers: a policy that appears for a gone network queues its
// network at once (PolicyChanged), so seeded policies would be collected
// before the clock starts; the workers' collect is the sweep's
// (collectCounted), with one LIST shared among many.
func BenchmarkRelease1000ClaimsOfGoneNetworks(b *testing.B) {
	b.Run("sweep", func(b *testing.B) { benchRelease(b, false, false, false) })
	b.Run("workers", func(b *testing.B) { benchRelease(b, true, false, false) })
	b.Run("ipam/sweep", func(b *testing.B) { benchRelease(b, false, true, false) })
	b.Run("ipam/workers", func(b *testing.B) { benchRelease(b, true, true, false) })
	b.Run("placed/sweep", func(b *testing.B) { benchRelease(b, false, false, true) })
}

// seedPolicies writes, for each claim's network, the labelled policy that
// places its identity.
func (h *hub) seedPolicies(b testing.TB, claims []string) []string {
	b.Helper()
	names := make([]string, len(claims))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, claim := range claims {
		ns, network, _ := hubctl.NetworkOfClaim(claim)
		names[i] = hubctl.PolicyName(ns, network)
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			_, err := h.dyn.Resource(hubctl.PolicyResource).Create(context.Background(), &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "policy.karmada.io/v1alpha1", "kind": "ClusterPropagationPolicy",
				"metadata": map[string]any{"name": names[i], "labels": map[string]any{hubctl.LabelPolicy: "true"}},
				"spec": map[string]any{"conflictResolution": "Overwrite", "resourceSelectors": []any{map[string]any{
					"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity", "namespace": ns, "name": network}},
					"placement": map[string]any{"clusterAffinity": map[string]any{"labelSelector": map[string]any{"matchExpressions": []any{
						map[string]any{"key": hubctl.LocationTopologyKey, "operator": "In", "values": []any{"dfw"}}}}}}},
			}}, metav1.CreateOptions{})
			if err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	return names
}

func benchRelease(b *testing.B, workers, ipam, placed bool) {
	const n = 1000
	h := newHubWith(b, 10*n, false) // nothing to bind: claims are seeded as a bound hub holds them
	peerCfg := h.cluster.Config
	if ipam {
		svc := ipamtest.Start(b, h.cluster.Config, ipamtest.Options{Project: platformProject})
		h.ctlCfg = svc.Config(platformProject)
		peerCfg = svc.Config(platformProject)
	}
	h.atHubRate(b)
	in := h.startOpts(b, "", "", startOpts{manual: true, tune: productionBackoff})
	if workers {
		// The startup sweep is over once a worker has read past the cache
		// for a network: the claims seeded after it are the workers'.
		in.run()
		before := h.requests.Load()
		in.ctl.Enqueue("gone", "sentinel")
		waitForLong(b, "the workers to start", time.Minute, func() bool { return h.requests.Load() > before })
	}
	claims := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns)
	released := func() float64 { return testutil.ToFloat64(hubctl.Releases(in.metrics, hubctl.ReleaseReleased)) }
	var ours, bare time.Duration
	var requests, eventWrites int64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		names := h.seedGoneClaims(b, n, 2*i)
		var policies []string
		if placed {
			policies = h.seedPolicies(b, names)
		}
		waitForLong(b, "the caches to hold the seeded claims", time.Minute, func() bool {
			for _, name := range names {
				_, claimed := in.claims.Get(name)
				_, allocated := in.allocations.Get(hubctl.AllocationName(h.ns, name))
				if !claimed || !allocated {
					return false
				}
			}
			for _, name := range policies {
				if _, ok := in.placement.Policy(name); !ok {
					return false
				}
			}
			return true
		})
		time.Sleep(2 * time.Second) // the rate limiter's burst back, as the bare client's is
		before, was, eventsBefore := h.requests.Load(), released(), h.eventWrites.Load()
		start := time.Now()
		b.StartTimer()
		if workers {
			for _, name := range names {
				ns, network, _ := hubctl.NetworkOfClaim(name)
				in.ctl.Enqueue(ns, network)
			}
			for released() < was+n {
				time.Sleep(5 * time.Millisecond)
			}
		} else {
			in.ctl.Sweep(context.Background())
		}
		b.StopTimer()
		ours += time.Since(start)
		requests += h.requests.Load() - before
		// Events are written in the background, after their release.
		waitForLong(b, "an Event per release", time.Minute, func() bool { return h.eventWrites.Load()-eventsBefore >= int64(n) })
		time.Sleep(time.Second)
		eventWrites += h.eventWrites.Load() - eventsBefore
		if left, _ := claims.List(context.Background(), metav1.ListOptions{}); len(left.Items) != 0 {
			b.Fatalf("%d claims left after the release", len(left.Items))
		}
		if placed {
			// The policy goes before the claim: once the last claim is
			// gone, every policy is.
			for _, name := range policies {
				if h.policyExists(b, name) {
					b.Fatalf("policy %s left after its network was collected", name)
				}
			}
		}

		names = h.seedGoneClaims(b, n, 2*i+1)
		if placed {
			policies = h.seedPolicies(b, names)
		}
		peer, err := dynamic.NewForConfig(hubRate(peerCfg))
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		for j, name := range names {
			if placed {
				if err := peer.Resource(hubctl.PolicyResource).Delete(context.Background(), policies[j], metav1.DeleteOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			if err := peer.Resource(hubctl.ClaimResource).Namespace(h.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		bare += time.Since(start)
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(per(bare), "bare-delete-ns/op")
	b.ReportMetric(per(ours)/per(bare), "x-of-bare-delete")
	b.ReportMetric(per(ours)/n, "ns/claim")
	b.ReportMetric(float64(requests)/float64(b.N*n), "requests/release")
	b.ReportMetric(float64(eventWrites)/float64(b.N*n), "event-writes/release")
}

// TestReleasesCountOnlyClaimsReallyDeletedOnARealAPIServer: a network that
// never held a claim (refused by the quota) and is then deleted releases
// nothing, so releases{released} counts A's claim alone. One worker keeps
// the order: B's collect is done before A's release is counted.
func TestReleasesCountOnlyClaimsReallyDeletedOnARealAPIServer(t *testing.T) {
	h := newHub(t, 1)
	in := h.startWith(t, "", "", func(c *hubctl.Config) { c.Workers = 1 })
	h.network(t, "team-m", "net-a")
	waitFor(t, "A's identity", func() bool { _, ok := h.identity("team-m", "net-a"); return ok })
	h.network(t, "team-m", "net-b")
	waitFor(t, "B refused by the quota", func() bool { return testutil.ToFloat64(quotaRefusals(in.metrics)) >= 1 })

	h.cluster.Delete(t, hubctl.NetworkResource, "team-m", "net-b")
	h.cluster.Delete(t, hubctl.NetworkResource, "team-m", "net-a")
	released := func() float64 { return testutil.ToFloat64(hubctl.Releases(in.metrics, hubctl.ReleaseReleased)) }
	waitFor(t, "A's claim released", func() bool {
		_, err := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns).Get(context.Background(), hubctl.ClaimName("team-m", "net-a"), metav1.GetOptions{})
		return apierrors.IsNotFound(err) && released() >= 1
	})
	if got := released(); got != 1 {
		t.Fatalf("releases{released} = %v for 1 claim deleted", got)
	}
}

// TestAQuotaRefusalIsOneEventWithTheNetworksUIDOnARealAPIServer: repeated
// refusals of one network aggregate into one events.k8s.io/v1 Event whose
// series grows, and which regards the network by its UID.
func TestAQuotaRefusalIsOneEventWithTheNetworksUIDOnARealAPIServer(t *testing.T) {
	h := newHub(t, 1)
	in := h.start(t, "", "")
	team := "e-" + h.ns // Events outlive the test: a fresh namespace per run
	h.network(t, team, "net-a")
	waitFor(t, "A's identity", func() bool { _, ok := h.identity(team, "net-a"); return ok })
	h.network(t, team, "net-b")
	b, err := h.dyn.Resource(hubctl.NetworkResource).Namespace(team).Get(context.Background(), "net-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B refused three times", func() bool { return testutil.ToFloat64(quotaRefusals(in.metrics)) >= 3 })
	var refusals []eventsv1.Event
	waitFor(t, "the refusals recorded as one Event with a series", func() bool {
		events, err := h.cs.EventsV1().Events(team).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=FabricIdentityQuotaExceeded"})
		if err != nil {
			return false
		}
		refusals = refusals[:0]
		for _, e := range events.Items {
			if e.Regarding.Name == "net-b" {
				refusals = append(refusals, e)
			}
		}
		return len(refusals) > 1 || (len(refusals) == 1 && refusals[0].Series != nil && refusals[0].Series.Count >= 2)
	})
	if len(refusals) != 1 {
		t.Fatalf("%d Events for one network's refusals, want 1 with a series", len(refusals))
	}
	if got := refusals[0].Regarding.UID; got != b.GetUID() {
		t.Fatalf("the Event regards UID %q, want the network's %q", got, b.GetUID())
	}
	if got := refusals[0].Action; got != "Claim" {
		t.Fatalf("the Event's action is %q, want Claim", got)
	}
}

// slowBackoff makes the backoff too long to reach an identity in a test: an
// identity then comes only from the claim watch's requeue.
func slowBackoff(c *hubctl.Config) { c.BaseDelay, c.MaxDelay = 10*time.Minute, 10*time.Minute }

// TestABoundClaimRequeuesItsNetworkOnARealAPIServer: the identity follows
// the address service's bind, not the network's backoff.
func TestABoundClaimRequeuesItsNetworkOnARealAPIServer(t *testing.T) {
	h := newHub(t, 5)
	h.startWith(t, "", "", slowBackoff)
	h.network(t, "team-w", "net-a")
	waitFor(t, "A's identity after its claim binds", func() bool { _, ok := h.identity("team-w", "net-a"); return ok })
}

// TestAFreedUnitRequeuesTheRefusedNetworkOnARealAPIServer: when a claim
// goes away, a network refused for quota tries again at once.
func TestAFreedUnitRequeuesTheRefusedNetworkOnARealAPIServer(t *testing.T) {
	h := newHub(t, 1)
	in := h.startWith(t, "", "", slowBackoff)
	h.network(t, "team-w", "net-a")
	waitFor(t, "A's identity", func() bool { _, ok := h.identity("team-w", "net-a"); return ok })
	h.network(t, "team-w", "net-b")
	// B's create can also meet a transient error (the quota's status in
	// contention), which the 10-minute backoff would not retry in time:
	// touching B requeues it until the quota itself refuses it.
	touched := time.Now()
	waitFor(t, "B refused by the quota", func() bool {
		if time.Since(touched) > time.Second {
			touched = time.Now()
			h.touch(t, "team-w", "net-b")
		}
		return testutil.ToFloat64(quotaRefusals(in.metrics)) >= 1
	})
	if _, ok := h.identity("team-w", "net-b"); ok {
		t.Fatal("B got an identity while A held the only unit")
	}
	h.cluster.Delete(t, hubctl.NetworkResource, "team-w", "net-a")
	waitFor(t, "B's identity once A's unit is free", func() bool { _, ok := h.identity("team-w", "net-b"); return ok })
}

// TestUnclaimedBlocksAreCountedOnARealAPIServer: a live network whose claim
// name's allocation is retained with no claimRef (it adopted its block, so
// it holds no claim) is counted by galactic_hub_unclaimed_blocks when a
// leader starts; once the network is gone it is not.
func TestUnclaimedBlocksAreCountedOnARealAPIServer(t *testing.T) {
	h := newHubWith(t, 5, false)
	team := "u-" + h.ns
	claim := hubctl.ClaimName(team, "adopted")
	h.cluster.Apply(t, hubctl.AllocationResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPAllocation",
		"metadata": map[string]any{"namespace": h.ns, "name": hubctl.AllocationName(h.ns, claim)},
		"spec":     map[string]any{"reclaimPolicy": hubctl.PolicyRetain},
	}})
	h.network(t, team, "adopted")
	h.cluster.Apply(t, hubctl.FabricIdentityResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity",
		"metadata": map[string]any{"namespace": team, "name": "adopted"},
		"spec":     map[string]any{"identity": int64(7), "networkRef": map[string]any{"name": "adopted"}},
	}})
	in := h.start(t, "", "")
	unclaimed := func() float64 { return testutil.ToFloat64(hubctl.UnclaimedBlocks(in.metrics)) }
	waitFor(t, "the adopted block counted", func() bool { return unclaimed() == 1 })
	h.cluster.Delete(t, hubctl.NetworkResource, team, "adopted")
	waitFor(t, "the gone network's block no longer counted", func() bool { return unclaimed() == 0 })
}

func testLog() *slog.Logger {
	if os.Getenv("GALACTICTEST_HUB_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
