package hubctl_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/datum-cloud/galactic-node/hubctl"
)

// The release path against a real API server, with the races it must
// survive made to happen, deterministically, by API wrappers in the test
// that run code between the controller's read and its delete.

// claimDeletes runs before ahead of the first delete of claim, and after
// behind it, and records every delete of it.
type claimDeletes struct {
	hubctl.API
	claim         string
	before, after func(err error)

	mu    sync.Mutex
	calls []deleteCall
}

type deleteCall struct {
	uid types.UID
	rv  string
	err error
}

func (d *claimDeletes) DeleteClaim(ctx context.Context, ns, name string, uid types.UID, rv string) (types.UID, error) {
	d.mu.Lock()
	first := name == d.claim && len(d.calls) == 0
	d.mu.Unlock()
	if first && d.before != nil {
		d.before(nil)
	}
	deleted, err := d.API.DeleteClaim(ctx, ns, name, uid, rv)
	if name == d.claim {
		d.mu.Lock()
		d.calls = append(d.calls, deleteCall{uid, rv, err})
		d.mu.Unlock()
	}
	if first && d.after != nil {
		d.after(err)
	}
	return deleted, err
}

// goneClaim seeds the bound claim of a gone network, with its Retain
// allocation, and waits until the controller's caches hold both.
func goneClaim(t *testing.T, h *hub, in *instance) (name string, network hubctl.Key) {
	t.Helper()
	name = h.seedGoneClaims(t, 1, int(time.Now().UnixNano()%1e9))[0]
	waitFor(t, "the caches to hold the claim and its allocation", func() bool {
		_, claimed := in.claims.Get(name)
		_, allocated := in.allocations.Get(hubctl.AllocationName(h.ns, name))
		return claimed && allocated
	})
	ns, net, _ := hubctl.NetworkOfClaim(name)
	return name, hubctl.Key{Namespace: ns, Name: net}
}

// Guards the resourceVersion precondition against a real API server: a
// claim written after the cache saw it (an annotation) is not deleted on
// the version the cache saw; the release reads it again and deletes it on
// the fresh version, in the same reconcile.
func TestAClaimChangedBeforeItsDeleteIsReadAgainAndReleasedOnARealAPIServer(t *testing.T) {
	h := newHubWith(t, 10, false)
	deletes := &claimDeletes{}
	in := h.startOpts(t, "", "", startOpts{manual: true, api: func(a hubctl.API) hubctl.API { deletes.API = a; return deletes }})
	name, network := goneClaim(t, h, in)
	deletes.claim = name
	deletes.before = func(error) {
		patch := []byte(`{"metadata":{"annotations":{"example.com/touched":"yes"}}}`)
		if _, err := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Errorf("annotate the claim: %v", err)
		}
	}
	if err := in.ctl.Reconcile(context.Background(), network); err != nil {
		t.Fatalf("reconcile of the gone network: %v", err)
	}
	if len(deletes.calls) != 2 || !errors.Is(deletes.calls[0].err, hubctl.ErrChanged) || deletes.calls[1].err != nil {
		t.Fatalf("deletes %+v: want one refused for the changed version, then one that deletes", deletes.calls)
	}
	if deletes.calls[0].uid != deletes.calls[1].uid || deletes.calls[0].rv == deletes.calls[1].rv {
		t.Fatalf("deletes %+v: want the same UID at a fresh resourceVersion", deletes.calls)
	}
	if _, err := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns).Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the claim after its release: %v, want it gone", err)
	}
	if released, failed := testutil.ToFloat64(hubctl.Releases(in.metrics, hubctl.ReleaseReleased)), testutil.ToFloat64(hubctl.Releases(in.metrics, hubctl.ReleaseError)); released != 1 || failed != 0 {
		t.Fatalf("releases released %v error %v, want 1 and 0", released, failed)
	}
}

// Guards the UID precondition against a real API server: a claim deleted
// and re-created (by someone else) after the cache saw it is not deleted by
// the stale preconditions, nor retried on a fresh read: the new claim is
// not the release's.
func TestAClaimRecreatedBeforeItsDeleteIsNotDeletedOnARealAPIServer(t *testing.T) {
	h := newHubWith(t, 10, false)
	deletes := &claimDeletes{}
	in := h.startOpts(t, "", "", startOpts{manual: true, api: func(a hubctl.API) hubctl.API { deletes.API = a; return deletes }})
	name, network := goneClaim(t, h, in)
	claims := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns)
	var recreated types.UID
	deletes.claim = name
	deletes.before = func(error) {
		old, err := claims.Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			err = claims.Delete(context.Background(), name, metav1.DeleteOptions{})
		}
		if err == nil {
			old.SetResourceVersion("")
			old.SetUID("")
			old.SetManagedFields(nil)
			old.SetCreationTimestamp(metav1.Time{})
			old.SetAnnotations(map[string]string{"example.com/made-by": "someone else"})
			var u *unstructured.Unstructured
			if u, err = claims.Create(context.Background(), old, metav1.CreateOptions{}); err == nil {
				recreated = u.GetUID()
			}
		}
		if err != nil {
			t.Errorf("re-create the claim: %v", err)
		}
	}
	deletes.after = func(err error) {
		u, getErr := claims.Get(context.Background(), name, metav1.GetOptions{})
		if getErr != nil || u.GetUID() != recreated || u.GetDeletionTimestamp() != nil {
			t.Errorf("right after the stale delete (%v), the re-created claim: %v", err, getErr)
		}
	}
	if err := in.ctl.Reconcile(context.Background(), network); !errors.Is(err, hubctl.ErrPrecondition) {
		t.Fatalf("reconcile = %v, want ErrPrecondition", err)
	}
	if len(deletes.calls) != 1 || deletes.calls[0].uid == recreated {
		t.Fatalf("deletes %+v: want one, with the old claim's UID", deletes.calls)
	}
	u, err := claims.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || u.GetUID() != recreated || u.GetDeletionTimestamp() != nil {
		t.Fatalf("the re-created claim after the reconcile: %v; want it there, untouched", err)
	}
}

// laggingIdentities is the controller's identity cache with the network
// key made to read present while armed, as an informer that has not yet
// seen the identity's delete.
type laggingIdentities struct {
	hubctl.IdentityCache
	key hubctl.Key

	mu         sync.Mutex
	armed      bool
	sawPresent chan struct{} // closed when a read answered present while armed
}

func (l *laggingIdentities) arm(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = on
}

func (l *laggingIdentities) isArmed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.armed
}

func (l *laggingIdentities) Get(ns, name string) (hubctl.FabricIdentity, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.armed && (hubctl.Key{Namespace: ns, Name: name}) == l.key {
		select {
		case <-l.sawPresent:
		default:
			close(l.sawPresent)
		}
		return hubctl.FabricIdentity{Namespace: ns, Name: name}, true
	}
	return l.IdentityCache.Get(ns, name)
}

// raceAPI re-creates the network the first time the controller deletes
// its identity, between the LIST that confirmed it gone and the delete,
// and answers a claim whose name retained an allocation as the address
// service does (409 AllocationRetained), which the stand-in cannot.
type raceAPI struct {
	hubctl.API
	t         *testing.T
	admin     dynamic.Interface
	network   hubctl.Key
	recreate  func() error
	once      sync.Once
	recreated chan struct{}
}

func (r *raceAPI) DeleteFabricIdentity(ctx context.Context, ns, name string) error {
	if (hubctl.Key{Namespace: ns, Name: name}) == r.network {
		r.once.Do(func() {
			if err := r.recreate(); err != nil {
				r.t.Errorf("re-create the network: %v", err)
			}
			close(r.recreated)
		})
	}
	return r.API.DeleteFabricIdentity(ctx, ns, name)
}

func (r *raceAPI) CreateClaim(ctx context.Context, c hubctl.Claim) (hubctl.Claim, error) {
	allocName := hubctl.AllocationName(c.Namespace, c.Name)
	a, err := r.admin.Resource(hubctl.AllocationResource).Namespace(c.Namespace).Get(ctx, allocName, metav1.GetOptions{})
	if err == nil {
		if ref, _, _ := unstructured.NestedString(a.Object, "spec", "claimRef", "name"); ref == "" {
			return hubctl.Claim{}, &hubctl.AllocationRetainedError{Allocation: allocName}
		}
	}
	return r.API.CreateClaim(ctx, c)
}

// Guards the collect against a network re-created between the LIST that
// confirmed it gone and the deletes: the collect deletes the identity and
// the claim of a network that lives again, and the end state must still
// be right. The re-created network's reconcile finds its identity still
// cached (the cache has not seen the collect's delete), so it is its
// identity's delete, reaching IdentityChanged, that brings it back: it
// ends with its identity and its block, the same, adopted from the Retain
// allocation, and holds no claim.
func TestANetworkRecreatedBetweenTheListAndTheDeleteEndsWithItsBlockOnARealAPIServer(t *testing.T) {
	h := newHub(t, 5)
	team := "race-" + h.ns
	x := hubctl.Key{Namespace: team, Name: "net-x"}
	lag := &laggingIdentities{key: x, sawPresent: make(chan struct{})}
	// The instance, for the seams: they run on the controller's and the
	// informers' goroutines.
	var started atomic.Pointer[instance]
	api := &raceAPI{t: t, admin: h.dyn, network: x, recreated: make(chan struct{})}
	api.recreate = func() error {
		_, err := h.dyn.Resource(hubctl.NetworkResource).Namespace(team).Create(context.Background(), &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "networking.datumapis.com/v1alpha", "kind": "Network",
			"metadata": map[string]any{"namespace": team, "name": x.Name}, "spec": map[string]any{},
		}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		// Once the network cache holds it, its reconcile is queued behind
		// this collect.
		deadline := time.Now().Add(30 * time.Second)
		for !started.Load().networks.Exists(team, x.Name) {
			if time.Now().After(deadline) {
				return fmt.Errorf("the network cache never saw %s again", x)
			}
			time.Sleep(5 * time.Millisecond)
		}
		lag.arm(true)
		return nil
	}
	in := h.startOpts(t, "", "", startOpts{
		api:        func(a hubctl.API) hubctl.API { api.API = a; return api },
		identities: func(c hubctl.IdentityCache) hubctl.IdentityCache { lag.IdentityCache = c; return lag },
		identityChanged: func(ns, name string, next func(ns, name string)) {
			if (hubctl.Key{Namespace: ns, Name: name}) == x && lag.isArmed() {
				// The identity's delete reaches the controller only once the
				// re-created network's reconcile has found it still cached.
				select {
				case <-lag.sawPresent:
				case <-started.Load().ctx.Done():
					return
				case <-time.After(30 * time.Second):
					t.Error("the re-created network was not reconciled while its identity read as cached")
				}
				lag.arm(false)
			}
			next(ns, name)
		},
	})
	started.Store(in)
	h.network(t, team, x.Name)
	waitFor(t, "the network's identity, cached", func() bool {
		_, cached := in.identities.Get(team, x.Name)
		_, ok := h.identity(team, x.Name)
		return ok && cached
	})
	first, _ := h.identity(team, x.Name)
	claim := hubctl.ClaimName(team, x.Name)
	waitFor(t, "the claim and allocation cached", func() bool {
		_, claimed := in.claims.Get(claim)
		_, allocated := in.allocations.Get(hubctl.AllocationName(h.ns, claim))
		return claimed && allocated
	})

	h.cluster.Delete(t, hubctl.NetworkResource, team, x.Name)
	select {
	case <-api.recreated:
	case <-time.After(30 * time.Second):
		t.Fatal("the collect never deleted the identity")
	}
	claims := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns)
	waitFor(t, "the re-created network's identity, its claim released", func() bool {
		id, ok := h.identity(team, x.Name)
		_, err := claims.Get(context.Background(), claim, metav1.GetOptions{})
		return ok && id == first && apierrors.IsNotFound(err)
	})
	select {
	case <-lag.sawPresent:
	default:
		t.Fatal("the race did not happen: the re-created network's reconcile never read its identity as cached")
	}
	waitFor(t, "the adopted block counted as held without a claim", func() bool {
		return testutil.ToFloat64(hubctl.UnclaimedBlocks(in.metrics)) == 1
	})
	a, err := h.dyn.Resource(hubctl.AllocationResource).Namespace(h.ns).Get(context.Background(), hubctl.AllocationName(h.ns, claim), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the retained allocation: %v", err)
	}
	if policy, _, _ := unstructured.NestedString(a.Object, "spec", "reclaimPolicy"); policy != hubctl.PolicyRetain {
		t.Fatalf("allocation policy %q, want Retain", policy)
	}
}
