package hubctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
)

// Unit tests of the release path over the informers' caches: what each
// release asks of the API server, the batched read past the cache, the
// preconditions, the identity cache and the fence. The same paths run
// against a real API server in cluster_test.go.

// A release over the caches is its writes and a share of one read past the
// cache: no read of the claim, its allocation or the identity.
func TestAReleaseOverTheCachesReadsOnlyPastTheCacheOnce(t *testing.T) {
	s := newScene(t, 2)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	s.gone("team", "a")
	cnt := &counting{API: s.c.api}
	s.c.api = cnt
	mustReconcile(t, s, "team", "a")
	want := map[string]int{"ListNetworkKeys": 1, "DeleteFabricIdentity": 1, "DeleteClaim": 1}
	if fmt.Sprint(cnt.calls) != fmt.Sprint(want) {
		t.Fatalf("requests %v, want %v", cnt.calls, want)
	}
	if len(s.svc.claims) != 0 {
		t.Fatal("the claim was not released")
	}
}

// An identity the cache does not hold is not deleted: one request fewer.
// (Its add, if it exists after all, reaches IdentityChanged.)
func TestACollectSkipsTheIdentityDeleteTheCacheSaysIsNeeded(t *testing.T) {
	s := newScene(t, 2)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	s.gone("team", "a")
	delete(s.svc.identities, Key{"team", "a"})
	cnt := &counting{API: s.c.api}
	s.c.api = cnt
	mustReconcile(t, s, "team", "a")
	if n := cnt.calls["DeleteFabricIdentity"]; n != 0 {
		t.Fatalf("%d identity deletes for an identity the cache lacks", n)
	}
}

// IdentityChanged reconciles a network exactly when its identity's
// presence and its own disagree.
func TestAnIdentityChangeQueuesItsNetworkWhenTheyDisagree(t *testing.T) {
	for _, tc := range []struct {
		identity, network, queued bool
	}{
		{identity: true, network: false, queued: true}, // a gone network's identity the collect may have skipped
		{identity: false, network: true, queued: true}, // a live network's identity deleted: a collect raced its return
		{identity: true, network: true, queued: false},
		{identity: false, network: false, queued: false},
	} {
		s := newScene(t, 2)
		if tc.network {
			s.live("team", "a")
		}
		if tc.identity {
			s.svc.identities[Key{"team", "a"}] = FabricIdentity{Namespace: "team", Name: "a", FabricID: 7}
		}
		s.c.IdentityChanged("team", "a")
		if got := s.c.queue.Len() == 1; got != tc.queued {
			t.Errorf("identity %v, network %v: queued %v, want %v", tc.identity, tc.network, got, tc.queued)
		}
	}
}

// A network re-created after the read that confirmed it gone, and seen by
// the cache before anything was deleted, keeps everything.
func TestANetworkBackBeforeTheDeletesKeepsEverything(t *testing.T) {
	s := newScene(t, 2)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	s.gone("team", "a")
	s.c.api = afterList{API: s.c.api, then: func() { s.live("team", "a") }}
	mustReconcile(t, s, "team", "a")
	if _, ok := s.identity("team", "a"); !ok || len(s.svc.claims) != 1 {
		t.Fatal("a network back before the deletes lost its identity or its claim")
	}
}

// afterList runs then after each LIST of networks has read them.
type afterList struct {
	API
	then func()
}

func (a afterList) ListNetworkKeys(ctx context.Context) ([]Key, error) {
	keys, err := a.API.ListNetworkKeys(ctx)
	a.then()
	return keys, err
}

// gatedList holds each LIST of networks, once it has read them, until the
// test lets it return.
type gatedList struct {
	API
	read    chan struct{}
	release chan struct{}
}

func newGatedList(api API) *gatedList {
	return &gatedList{API: api, read: make(chan struct{}), release: make(chan struct{})}
}

func (g *gatedList) ListNetworkKeys(ctx context.Context) ([]Key, error) {
	keys, err := g.API.ListNetworkKeys(ctx)
	g.read <- struct{}{}
	<-g.release
	return keys, err
}

// nextRead waits for g's next LIST to have read, failing the test rather
// than hanging when none comes.
func nextRead(t *testing.T, g *gatedList) {
	t.Helper()
	select {
	case <-g.read:
	case <-time.After(30 * time.Second):
		t.Fatal("no LIST of networks came")
	}
}

// waitJoined waits until key waits for the next read.
func waitJoined(t *testing.T, c *Controller, key Key) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.confirm.mu.Lock()
		joined := c.confirm.next != nil && c.confirm.next.keys[key]
		c.confirm.mu.Unlock()
		if joined {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never joined the next read", key)
		}
		time.Sleep(time.Millisecond)
	}
}

type answer struct {
	gone bool
	err  error
}

func ask(c *Controller, key Key) chan answer {
	ch := make(chan answer, 1)
	go func() {
		gone, err := c.confirmGone(context.Background(), key)
		ch <- answer{gone, err}
	}()
	return ch
}

// An ask made while a LIST is in flight is answered by the next LIST, not
// by the one in flight, which read before the network was re-created.
func TestAnAskIsAnsweredOnlyByAReadThatStartedAfterIt(t *testing.T) {
	s := newScene(t, 2)
	g := newGatedList(s.c.api)
	s.c.api = g
	first := ask(s.c, Key{"team", "old"})
	nextRead(t, g) // the first LIST has read: no team/x
	s.svc.addNetwork("team", "x")
	second := ask(s.c, Key{"team", "x"})
	waitJoined(t, s.c, Key{"team", "x"})
	g.release <- struct{}{}
	if a := <-first; a.err != nil || !a.gone {
		t.Fatalf("team/old: %+v, want gone", a)
	}
	select {
	case a := <-second:
		t.Fatalf("team/x answered %+v by the LIST that read before it was re-created", a)
	case <-g.read:
	}
	g.release <- struct{}{}
	if a := <-second; a.err != nil || a.gone {
		t.Fatalf("team/x, re-created during the first LIST: %+v, want live", a)
	}
}

// Collects that ask while a LIST is in flight share the next one: 16
// collects, two LISTs.
func TestCollectsThatAskTogetherShareOneList(t *testing.T) {
	s := newScene(t, 20)
	var keys []Key
	for i := range 16 {
		k := Key{"team", fmt.Sprint("net-", i)}
		keys = append(keys, k)
		s.live(k.Namespace, k.Name)
		mustReconcile(t, s, k.Namespace, k.Name)
		s.gone(k.Namespace, k.Name)
	}
	cnt := &counting{API: s.c.api}
	g := newGatedList(cnt)
	s.c.api = g
	errs := make(chan error, len(keys))
	go func() { errs <- s.c.Reconcile(context.Background(), keys[0]) }()
	nextRead(t, g)
	for _, k := range keys[1:] {
		go func() { errs <- s.c.Reconcile(context.Background(), k) }()
		waitJoined(t, s.c, k)
	}
	g.release <- struct{}{}
	nextRead(t, g)
	g.release <- struct{}{}
	for range keys {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := cnt.calls["ListNetworkKeys"]; n != 2 {
		t.Fatalf("%d LISTs for 16 collects, want 2", n)
	}
	if len(s.svc.claims) != 0 {
		t.Fatalf("%d claims left", len(s.svc.claims))
	}
}

// A failed LIST answers every collect waiting on it with its error, and
// none collects anything.
func TestAFailedListCollectsNothingForAnyWaiter(t *testing.T) {
	s := newScene(t, 20)
	var keys []Key
	for i := range 8 {
		k := Key{"team", fmt.Sprint("net-", i)}
		keys = append(keys, k)
		s.live(k.Namespace, k.Name)
		mustReconcile(t, s, k.Namespace, k.Name)
		s.gone(k.Namespace, k.Name)
	}
	s.svc.getNetworkErr = errInjected
	g := newGatedList(s.c.api)
	s.c.api = g
	errs := make(chan error, len(keys))
	go func() { errs <- s.c.Reconcile(context.Background(), keys[0]) }()
	nextRead(t, g)
	for _, k := range keys[1:] {
		go func() { errs <- s.c.Reconcile(context.Background(), k) }()
		waitJoined(t, s.c, k)
	}
	g.release <- struct{}{}
	nextRead(t, g)
	g.release <- struct{}{}
	for range keys {
		if err := <-errs; !errors.Is(err, errInjected) {
			t.Fatalf("collect after a failed LIST: %v, want the LIST's error", err)
		}
	}
	if len(s.svc.claims) != len(keys) || len(s.svc.identities) != len(keys) {
		t.Fatalf("%d claims and %d identities left of %d", len(s.svc.claims), len(s.svc.identities), len(keys))
	}
}

// A hub whose LIST takes more pages than a batch asks about networks is
// asked with GETs instead: fewer requests.
func TestALoneCollectInABigHubReadsItsNetworkAlone(t *testing.T) {
	s := newSceneIn(t, 2, mode{big: true})
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	s.gone("team", "a")
	cnt := &counting{API: s.c.api}
	s.c.api = cnt
	mustReconcile(t, s, "team", "a")
	if cnt.calls["GetNetwork"] != 1 || cnt.calls["ListNetworkKeys"] != 0 {
		t.Fatalf("requests %v, want one GetNetwork and no LIST", cnt.calls)
	}
}

// staleClaims is a claim cache that still holds the claims it was given.
type staleClaims struct {
	ClaimCache
	old map[string]Claim
}

func (s staleClaims) Get(name string) (Claim, bool) {
	if c, ok := s.old[name]; ok {
		return c, true
	}
	return s.ClaimCache.Get(name)
}

// staleAllocations is an allocation cache that still holds the allocations
// it was given.
type staleAllocations struct {
	AllocationCache
	old map[string]Allocation
}

func (s staleAllocations) Get(name string) (Allocation, bool) {
	if a, ok := s.old[name]; ok {
		return a, true
	}
	return s.AllocationCache.Get(name)
}

// gonePastAStaleCache makes team/a gone, with the claim cache holding its
// claim as it was, and returns that claim.
func gonePastAStaleCache(t *testing.T, s *scene) Claim {
	t.Helper()
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	s.gone("team", "a")
	name := ClaimName("team", "a")
	old := s.svc.claims[name]
	s.c.cfg.Claims = staleClaims{s.c.cfg.Claims, map[string]Claim{name: old}}
	return old
}

// Guards the resourceVersion precondition and its retry: a claim that
// changed after the cache saw it is not deleted on that version; it is
// read again past the cache and released on the fresh read, in the same
// release.
func TestAClaimChangedSinceTheCacheSawItIsReadAgainAndReleased(t *testing.T) {
	s := newScene(t, 2)
	old := gonePastAStaleCache(t, s)
	s.svc.changeClaim(old.Name, func(c *Claim) { c.NetworkName = "a" }) // an annotation written
	cnt := &counting{API: s.c.api}
	s.c.api = cnt
	mustReconcile(t, s, "team", "a")
	if _, ok := s.svc.claims[old.Name]; ok {
		t.Fatal("the changed claim was not released")
	}
	if cnt.calls["DeleteClaim"] != 2 || cnt.calls["GetClaim"] != 1 || cnt.calls["GetAllocation"] != 1 {
		t.Fatalf("requests %v: want a refused delete, a fresh read of the claim and its allocation, a delete", cnt.calls)
	}
	released, failed := testutil.ToFloat64(s.m.releases.WithLabelValues(ReleaseReleased)), testutil.ToFloat64(s.m.releases.WithLabelValues(ReleaseError))
	if released != 1 || failed != 0 {
		t.Fatalf("releases released %v error %v, want 1 and 0", released, failed)
	}
}

// The retry keeps every rule: decided again on fresh reads, a claim whose
// allocation is now recorded Delete is kept, however the stale cache
// recorded it.
func TestTheRetryOfAChangedClaimChecksItsAllocationAfresh(t *testing.T) {
	s := newScene(t, 2)
	old := gonePastAStaleCache(t, s)
	allocName := old.BoundAllocation
	s.c.cfg.Allocations = staleAllocations{s.c.cfg.Allocations, map[string]Allocation{allocName: s.svc.allocations[allocName]}}
	s.svc.mu.Lock()
	a := s.svc.allocations[allocName]
	a.ReclaimPolicy = PolicyDelete
	s.svc.allocations[allocName] = a
	s.svc.mu.Unlock()
	s.svc.changeClaim(old.Name, func(*Claim) {})
	err := s.reconcile(t, "team", "a")
	if _, ok := s.svc.claims[old.Name]; !ok {
		t.Fatal("the claim was deleted though its allocation is now recorded Delete")
	}
	if err == nil || testutil.ToFloat64(s.m.releases.WithLabelValues(ReleaseKept)) != 1 {
		t.Fatalf("reconcile = %v, want the claim kept", err)
	}
}

// A claim that changes again before the retry's delete is left to the
// backoff: two deletes, not more.
func TestAClaimThatKeepsChangingIsRetriedOnceThenBackedOff(t *testing.T) {
	s := newScene(t, 2)
	old := gonePastAStaleCache(t, s)
	var bump func(*addressService)
	bump = func(svc *addressService) {
		svc.changeClaim(old.Name, func(*Claim) {})
		svc.beforeDelete = bump
	}
	s.svc.beforeDelete = bump
	cnt := &counting{API: s.c.api}
	s.c.api = cnt
	if err := s.reconcile(t, "team", "a"); !errors.Is(err, ErrChanged) {
		t.Fatalf("reconcile = %v, want ErrChanged", err)
	}
	if _, ok := s.svc.claims[old.Name]; !ok || cnt.calls["DeleteClaim"] != 2 {
		t.Fatalf("claim left %v after %d deletes, want it left after 2", ok, cnt.calls["DeleteClaim"])
	}
}

// A claim that the cache saw and that was re-created since (a new UID) is
// never deleted by the stale precondition, and not retried on a fresh read:
// the new claim is whoever made it's.
func TestAClaimRecreatedSinceTheCacheSawItIsNotDeleted(t *testing.T) {
	s := newScene(t, 2)
	old := gonePastAStaleCache(t, s)
	s.svc.changeClaim(old.Name, func(c *Claim) { c.UID = "re-created" })
	cnt := &counting{API: s.c.api}
	s.c.api = cnt
	if err := s.reconcile(t, "team", "a"); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("reconcile = %v, want ErrPrecondition", err)
	}
	if c, ok := s.svc.claims[old.Name]; !ok || c.UID != "re-created" || cnt.calls["DeleteClaim"] != 1 {
		t.Fatalf("the re-created claim: present %v, %d deletes; want it kept after 1", ok, cnt.calls["DeleteClaim"])
	}
}

// A returning network whose claim is still being deleted waits for it to
// go, then adopts the retained block, and is counted as holding no claim;
// the claim's going requeues it.
func TestAReturningNetworkWaitsForItsGoingClaim(t *testing.T) {
	s := newScene(t, 2)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	first, _ := s.identity("team", "a")
	name := ClaimName("team", "a")
	delete(s.svc.identities, Key{"team", "a"})
	s.svc.changeClaim(name, func(c *Claim) { c.Deleting = true })
	if err := s.reconcile(t, "team", "a"); !errors.Is(err, errClaimGoing) {
		t.Fatalf("reconcile = %v, want errClaimGoing", err)
	}
	if _, ok := s.identity("team", "a"); ok {
		t.Fatal("an identity was written from a claim being deleted")
	}
	// The address service ends the delete: Retain keeps the allocation.
	s.svc.beforeDelete = nil
	if _, err := s.svc.DeleteClaim(context.Background(), platform, name, "", ""); err != nil {
		t.Fatal(err)
	}
	s.c.ClaimGone()
	if s.c.queue.Len() != 1 {
		t.Fatal("the claim's going did not requeue its network")
	}
	mustReconcile(t, s, "team", "a")
	if got, ok := s.identity("team", "a"); !ok || got != first || testutil.ToFloat64(s.m.unclaimed) != 1 {
		t.Fatalf("identity %d (%v), unclaimed %v; want %d adopted and counted", got, ok, testutil.ToFloat64(s.m.unclaimed), first)
	}
}

// refusingFence is a deposed leader's fence.
type refusingFence struct{ holds int }

func (f *refusingFence) Hold(context.Context) (context.Context, context.CancelFunc, error) {
	f.holds++
	return nil, nil, fmt.Errorf("lease renewed too long ago: %w", ErrDeposed)
}

// Guards the fence: a deposed leader writes nothing, neither for a live
// network nor for a gone one, and says why.
func TestAFenceThatRefusesStopsEveryWrite(t *testing.T) {
	s := newScene(t, 2)
	s.live("team", "gone")
	mustReconcile(t, s, "team", "gone")
	s.gone("team", "gone")
	s.live("team", "new")
	cnt := &counting{API: s.svc}
	fence := &refusingFence{}
	m, _ := NewMetrics(prometheus.NewPedanticRegistry())
	deposed := New(cnt, s.cache, nil, m, nil, s.svc.cached(Config{PlatformNamespace: platform, Fence: fence}))
	for _, name := range []string{"new", "gone"} {
		if err := deposed.Reconcile(context.Background(), Key{"team", name}); !errors.Is(err, ErrDeposed) {
			t.Fatalf("reconcile %s while deposed = %v, want ErrDeposed", name, err)
		}
	}
	deposed.Sweep(context.Background())
	for _, w := range []string{"CreateClaim", "CreateFabricIdentity", "DeleteFabricIdentity", "DeleteClaim"} {
		if cnt.calls[w] != 0 {
			t.Errorf("%s reached the API %d times while deposed", w, cnt.calls[w])
		}
	}
	if fence.holds == 0 || len(s.svc.claims) != 1 || len(s.svc.identities) != 1 {
		t.Fatalf("fence asked %d times; %d claims, %d identities: want the gone network's kept, none made", fence.holds, len(s.svc.claims), len(s.svc.identities))
	}
}

type fenceCtxKey struct{}

// recordingFence lets every write through, with a context of its own.
type recordingFence struct {
	mu             sync.Mutex
	holds, cancels int
}

func (f *recordingFence) Hold(ctx context.Context) (context.Context, context.CancelFunc, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds++
	ctx, cancel := context.WithCancel(context.WithValue(ctx, fenceCtxKey{}, true))
	return ctx, func() {
		f.mu.Lock()
		f.cancels++
		f.mu.Unlock()
		cancel()
	}, nil
}

// heldWrites records whether each write came with the fence's context.
type heldWrites struct {
	*addressService
	writes, held int
}

func (h *heldWrites) note(ctx context.Context) {
	h.writes++
	if ctx.Value(fenceCtxKey{}) != nil {
		h.held++
	}
}

func (h *heldWrites) CreateClaim(ctx context.Context, c Claim) (Claim, error) {
	h.note(ctx)
	return h.addressService.CreateClaim(ctx, c)
}

func (h *heldWrites) CreateFabricIdentity(ctx context.Context, id FabricIdentity) error {
	h.note(ctx)
	return h.addressService.CreateFabricIdentity(ctx, id)
}

func (h *heldWrites) DeleteFabricIdentity(ctx context.Context, ns, name string) error {
	h.note(ctx)
	return h.addressService.DeleteFabricIdentity(ctx, ns, name)
}

func (h *heldWrites) DeleteClaim(ctx context.Context, ns, name string, uid types.UID, rv string) (types.UID, error) {
	h.note(ctx)
	return h.addressService.DeleteClaim(ctx, ns, name, uid, rv)
}

func (h *heldWrites) Event(ctx context.Context, n Network, warning bool, reason, msg string) {
	h.note(ctx)
	h.addressService.Event(ctx, n, warning, reason, msg)
}

func (h *heldWrites) ClaimEvent(ctx context.Context, n *Network, c Claim, warning bool, reason, action, msg string) {
	h.note(ctx)
	h.addressService.ClaimEvent(ctx, n, c, warning, reason, action, msg)
}

// Every write, the quota and release events included, is made under its
// own hold of the fence, with the fence's context, and the hold is ended
// after it.
func TestEveryWriteIsMadeUnderTheFence(t *testing.T) {
	svc := newAddressService(1)
	cache := fakeCache{}
	api := &heldWrites{addressService: svc}
	fence := &recordingFence{}
	c := New(api, cache, nil, nil, nil, svc.cached(Config{PlatformNamespace: platform, Fence: fence}))
	for _, n := range []string{"a", "b"} {
		svc.addNetwork("team", n)
		cache[Key{"team", n}] = true
		_ = c.Reconcile(context.Background(), Key{"team", n}) // b: refused by the quota, an event
	}
	svc.deleteNetwork("team", "a")
	delete(cache, Key{"team", "a"})
	if err := c.Reconcile(context.Background(), Key{"team", "a"}); err != nil {
		t.Fatal(err)
	}
	// claim a, identity a, claim b (refused), event b, identity a, claim a,
	// event claim a released
	if api.writes != 7 || api.held != api.writes || fence.holds != api.writes || fence.cancels != fence.holds {
		t.Fatalf("%d writes, %d with the fence's context; %d holds, %d ended", api.writes, api.held, fence.holds, fence.cancels)
	}
}

// reCreatedAfterChanged is the API of a claim deleted and made again (a new
// UID) right after the first delete met ErrChanged, before the retry reads
// it: the interleaving a test cannot get from the address service's model
// alone.
type reCreatedAfterChanged struct {
	API
	svc  *addressService
	done bool
}

func (r *reCreatedAfterChanged) DeleteClaim(ctx context.Context, ns, name string, uid types.UID, rv string) (types.UID, error) {
	deleted, err := r.API.DeleteClaim(ctx, ns, name, uid, rv)
	if errors.Is(err, ErrChanged) && !r.done {
		r.done = true
		r.svc.mu.Lock()
		c := r.svc.claims[name]
		c.UID, c.ResourceVersion = "re-created", r.svc.nextRV()
		r.svc.claims[name] = c
		r.svc.mu.Unlock()
	}
	return deleted, err
}

// Guards the UID check of the retry after ErrChanged: a claim re-created
// between the refused delete and the fresh read is someone else's, made
// after the network was confirmed gone, and is never deleted. Found in
// review: the retry took the fresh claim's UID as its precondition.
func TestTheRetryOfAChangedClaimNeverDeletesARecreatedOne(t *testing.T) {
	s := newScene(t, 2)
	old := gonePastAStaleCache(t, s)
	s.svc.changeClaim(old.Name, func(*Claim) {})
	s.c.api = &reCreatedAfterChanged{API: s.c.api, svc: s.svc}
	err := s.reconcile(t, "team", "a")
	if c, ok := s.svc.claims[old.Name]; !ok || c.UID != "re-created" {
		t.Fatalf("the claim re-created after the refused delete was deleted by the retry (reconcile: %v)", err)
	}
	if !errors.Is(err, ErrPrecondition) {
		t.Errorf("reconcile = %v, want an error wrapping ErrPrecondition, so that the network is requeued", err)
	}
}

// Guards the unclaimed-blocks gauge against a network read gone for a
// moment (deleted and made again faster than the cache): the read past the
// cache finds it living, nothing is collected, and the adopted block it
// holds stays counted. Found in review: it dropped out of the gauge until
// a restart.
func TestANetworkFoundLivingStaysCountedAsUnclaimed(t *testing.T) {
	s := newScene(t, 5)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	s.gone("team", "a")
	mustReconcile(t, s, "team", "a")
	s.live("team", "a")
	mustReconcile(t, s, "team", "a") // adopts its retained block: no claim
	if v := testutil.ToFloat64(s.m.unclaimed); v != 1 {
		t.Fatalf("setup: unclaimed blocks %v, want 1", v)
	}
	delete(s.cache, Key{"team", "a"}) // the cache reads it gone; the API server has it
	mustReconcile(t, s, "team", "a")
	s.cache[Key{"team", "a"}] = true
	mustReconcile(t, s, "team", "a")
	if v := testutil.ToFloat64(s.m.unclaimed); v != 1 {
		t.Errorf("a live network holding an adopted block: unclaimed blocks %v, want 1", v)
	}
}

// Guards the check after a delete a server does not guard: ipam deletes
// whichever claim holds the name (AllocatingREST.Delete never reads
// options.Preconditions). A network re-created between the controller's
// read of its claim and its delete, with a claim made anew by another
// writer, loses that claim to the delete; the controller learns it from
// the UID the server answers, reads the network past the cache, and claims
// again at once: ipam re-binds the retained block, so the network keeps
// its fabric ID and holds a claim, recorded by an event and a metric.
func TestALiveNetworksClaimDeletedInPlaceOfAGoneOnesIsClaimedAgain(t *testing.T) {
	for name, md := range map[string]mode{"ipam/informers": {ipam: true}, "ipam/direct": {ipam: true, direct: true}} {
		t.Run(name, func(t *testing.T) {
			s := newSceneIn(t, 2, md)
			id, recreated := takeClaimInTheWindow(t, s, false, nil)
			if err := s.c.Reconcile(context.Background(), Key{"team", "a"}); err != nil {
				t.Fatalf("reconcile: %v", err)
			}
			claim := ClaimName("team", "a")
			c, ok := s.svc.claims[claim]
			if !ok || c.UID == recreated.UID || c.Phase != "Bound" {
				t.Fatalf("the live network's claim: present %v %+v; want one made again after the delete took %s", ok, c, recreated.UID)
			}
			if fid, _ := FabricIDFromBlock(c.AllocatedCIDR); fid != id {
				t.Fatalf("the claim made again holds fabric ID %d, want the network's %d", fid, id)
			}
			if got := testutil.ToFloat64(s.m.restored); got != 1 {
				t.Fatalf("restored = %v, want 1", got)
			}
			if !slices.ContainsFunc(s.svc.events, func(e string) bool { return strings.Contains(e, "FabricIdentityClaimRestored") }) {
				t.Fatalf("no FabricIdentityClaimRestored event: %v", s.svc.events)
			}
			// Its identity, deleted by the collect, comes back from the
			// same block when the network is reconciled again.
			if err := s.reconcile(t, "team", "a"); err != nil {
				t.Fatal(err)
			}
			if got, ok := s.identity("team", "a"); !ok || got != id {
				t.Fatalf("identity after the restore: %d %v, want %d", got, ok, id)
			}
		})
	}
}

// takeClaimInTheWindow gives network team/a of scene s its identity, then
// has it go and, inside the controller's claim delete, another writer bring
// it back: its claim deleted and made anew (recreated), and, with
// writeIdentity, its identity written from it. during runs last inside the
// window. It returns the network's fabric ID.
func takeClaimInTheWindow(t *testing.T, s *scene, writeIdentity bool, during func(*addressService)) (uint32, *Claim) {
	t.Helper()
	s.live("team", "a")
	if err := s.reconcile(t, "team", "a"); err != nil {
		t.Fatal(err)
	}
	id, _ := s.identity("team", "a")
	s.gone("team", "a")
	claim := ClaimName("team", "a")
	recreated := &Claim{}
	s.svc.beforeDelete = func(svc *addressService) {
		svc.addNetwork("team", "a")
		s.cache[Key{"team", "a"}] = true
		svc.mu.Lock()
		old := svc.claims[claim]
		delete(svc.claims, claim)
		a := svc.allocations[old.BoundAllocation]
		a.ClaimRef = ""
		svc.allocations[old.BoundAllocation] = a
		svc.mu.Unlock()
		c, err := svc.CreateClaim(context.Background(), Claim{Namespace: platform, Name: claim, PrefixLength: 64, ReclaimPolicy: PolicyRetain})
		if err != nil {
			t.Error(err)
		}
		*recreated = c
		if writeIdentity {
			_ = svc.CreateFabricIdentity(context.Background(), FabricIdentity{Namespace: "team", Name: "a", FabricID: id, NetworkRef: "a"})
		}
		if during != nil {
			during(svc)
		}
	}
	return id, recreated
}

// Adopt in every form ipam answers: the seed's 409 with cause, ipam
// 012be054's plain 409 (decided by the allocation, Retain with no
// claimRef), and a41cd6f1's 201 that re-bound the block. Each keeps the
// fabric ID; the unclaimed-blocks count is 1 for an adopted block and 0
// for a re-bound one, which holds a claim.
func TestAReturningNameKeepsItsBlockInEveryFormTheServiceAnswers(t *testing.T) {
	for name, form := range map[string]func(*addressService){
		"409 with cause": func(*addressService) {},
		"plain 409":      func(s *addressService) { s.plainConflict = true },
		"201 re-bound":   func(s *addressService) { s.ipam = true },
	} {
		t.Run(name, func(t *testing.T) {
			s := newScene(t, 2)
			form(s.svc)
			s.live("team", "a")
			if err := s.reconcile(t, "team", "a"); err != nil {
				t.Fatal(err)
			}
			id, _ := s.identity("team", "a")
			s.gone("team", "a")
			if err := s.reconcile(t, "team", "a"); err != nil {
				t.Fatal(err)
			}
			s.live("team", "a")
			if err := s.reconcile(t, "team", "a"); err != nil {
				t.Fatalf("the returning name: %v", err)
			}
			if got, ok := s.identity("team", "a"); !ok || got != id {
				t.Fatalf("identity %d %v, want the block's %d", got, ok, id)
			}
			_, claimed := s.svc.claims[ClaimName("team", "a")]
			want := 1.0
			if claimed {
				want = 0
			}
			if got := testutil.ToFloat64(s.m.unclaimed); got != want {
				t.Fatalf("unclaimed = %v with a claim held %v", got, claimed)
			}
			if name == "201 re-bound" && !claimed {
				t.Fatal("a re-bound block holds no claim")
			}
		})
	}
}

// A plain 409 whose allocation is no retained block (bound to a claim the
// controller did not see) is a configuration refusal, named once, and
// never adopted.
func TestAPlainConflictWithNoRetainedBlockIsNotAdopted(t *testing.T) {
	s := newScene(t, 2)
	s.live("team", "a")
	alloc := AllocationName(platform, ClaimName("team", "a"))
	s.svc.allocations[alloc] = Allocation{Name: alloc, ClaimRef: "someone-else", ReclaimPolicy: PolicyRetain, AllocatedCIDR: "fd00:0:0:9::/64"}
	s.svc.plainConflict = true
	var config *ConfigError
	for range 3 {
		if err := s.reconcile(t, "team", "a"); !errors.As(err, &config) || config.Cause != CauseConflict {
			t.Fatalf("reconcile = %v, want a ConfigError of cause conflict", err)
		}
	}
	if _, ok := s.identity("team", "a"); ok {
		t.Fatal("an identity was written from a block bound to another claim")
	}
	if got := testutil.ToFloat64(s.m.refusals.WithLabelValues(RefusalConfiguration, CauseConflict)); got != 1 {
		t.Fatalf("refusals = %v after three refused reconciles, want 1", got)
	}
	if got := testutil.ToFloat64(s.m.refusedNets.WithLabelValues(RefusalConfiguration)); got != 1 {
		t.Fatalf("networks refused = %v, want 1", got)
	}
}

// lostClaimScene is the race of TestALiveNetworksClaimDeletedInPlaceOfAGoneOnesIsClaimedAgain
// with the other writer writing the identity too, so that the network's
// identity exists while its claim is gone: ensure's early return on an
// existing identity must not leave it so.
func lostClaimScene(t *testing.T, api func(*addressService) API, during func(*addressService)) (*scene, uint32) {
	t.Helper()
	s := newSceneIn(t, 2, mode{ipam: true})
	if api != nil {
		s.c = New(api(s.svc), s.cache, nil, s.m, nil, s.config())
	}
	id, _ := takeClaimInTheWindow(t, s, true, during)
	return s, id
}

// settlesWithItsClaim reconciles the network a few times, as its requeues
// would, and checks that it ends holding a claim on its block.
func settlesWithItsClaim(t *testing.T, s *scene, id uint32) {
	t.Helper()
	for range 3 {
		_ = s.reconcile(t, "team", "a")
	}
	c, ok := s.svc.claims[ClaimName("team", "a")]
	if fid, _ := FabricIDFromBlock(c.AllocatedCIDR); !ok || fid != id {
		t.Fatalf("the live network holds claim %v %+v, want one on its block (fabric ID %d)", ok, c, id)
	}
	if got, ok := s.identity("team", "a"); !ok || got != id {
		t.Fatalf("identity %d %v, want %d", got, ok, id)
	}
}

// Guards the check after a delete when reading the network fails: the
// network is not taken for gone; the next reconcile claims for it, though
// its identity exists.
func TestALostClaimWhoseNetworkCannotBeReadIsClaimedLater(t *testing.T) {
	s, id := lostClaimScene(t, nil, func(svc *addressService) { svc.getNetworkErr = errInjected })
	if err := s.reconcile(t, "team", "a"); err == nil {
		t.Fatal("a collect whose check after the delete could not read the network succeeded")
	}
	s.svc.mu.Lock()
	s.svc.getNetworkErr = nil
	s.svc.mu.Unlock()
	settlesWithItsClaim(t, s, id)
}

// Guards the restore when the claim made again is refused (Milo gives the
// deleted claim's quota unit back only after its garbage collector runs):
// the network claims again once a unit is free, though its identity exists.
func TestALostClaimRefusedForQuotaIsClaimedOnceAUnitIsFree(t *testing.T) {
	var refusing *refusingCreates
	s, id := lostClaimScene(t, func(svc *addressService) API {
		refusing = &refusingCreates{addressService: svc}
		return refusing
	}, func(*addressService) {
		refusing.err = fmt.Errorf("Insufficient quota resources available: %w", ErrQuota)
	})
	if err := s.reconcile(t, "team", "a"); !errors.Is(err, ErrQuota) {
		t.Fatalf("reconcile = %v, want the restore refused for quota", err)
	}
	if got := testutil.ToFloat64(s.m.restored); got != 0 {
		t.Fatalf("restored = %v after a refused restore", got)
	}
	refusing.err = nil
	settlesWithItsClaim(t, s, id)
}

// A claim ipam shows Releasing, with no deletionTimestamp, is being
// deleted: a returning network waits for it rather than taking its block,
// and asks for its delete again, which is how ipam ends one whose delete
// stopped after publishing the phase; the collect of a gone network
// deletes it again too.
func TestAClaimLeftReleasingIsDeletedAgain(t *testing.T) {
	s := newSceneIn(t, 2, mode{ipam: true})
	s.live("team", "a")
	if err := s.reconcile(t, "team", "a"); err != nil {
		t.Fatal(err)
	}
	name := ClaimName("team", "a")
	stuck := func() {
		s.svc.changeClaim(name, func(c *Claim) { c.Phase, c.Deleting = PhaseReleasing, true })
	}
	stuck()
	s.gone("team", "a")
	cnt := &counting{API: s.svc}
	s.c = New(cnt, s.cache, nil, s.m, nil, s.config())
	if err := s.reconcile(t, "team", "a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.svc.claims[name]; ok || cnt.calls["DeleteClaim"] != 1 {
		t.Fatalf("claim left %v after %d deletes: want a Releasing claim of a gone network deleted again", ok, cnt.calls["DeleteClaim"])
	}

	s.live("team", "b")
	if err := s.reconcile(t, "team", "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.svc.DeleteFabricIdentity(context.Background(), "team", "b"); err != nil {
		t.Fatal(err)
	}
	name = ClaimName("team", "b")
	stuck()
	before := cnt.calls["DeleteClaim"]
	if err := s.reconcile(t, "team", "b"); !errors.Is(err, errClaimGoing) {
		t.Fatalf("reconcile of a network whose claim is Releasing = %v, want errClaimGoing", err)
	}
	if _, ok := s.identity("team", "b"); ok {
		t.Fatal("an identity was written from a claim being released")
	}
	if cnt.calls["DeleteClaim"] != before+1 {
		t.Fatalf("%d deletes of the claim left Releasing, want 1", cnt.calls["DeleteClaim"]-before)
	}
}

// A restore answered by a plain 409 (ipam 012be054) adopts the block: the
// network holds no claim and stays counted unclaimed after the collect
// that led to it.
func TestARestoreThatAdoptsStaysCountedUnclaimed(t *testing.T) {
	s, _ := lostClaimScene(t, nil, func(svc *addressService) { svc.plainConflict = true })
	_ = s.reconcile(t, "team", "a")
	if got := testutil.ToFloat64(s.m.unclaimed); got != 1 {
		t.Fatalf("unclaimed = %v after a restore that adopted, want 1", got)
	}
}
