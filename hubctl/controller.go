package hubctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
)

// Key names a network.
type Key struct{ Namespace, Name string }

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Config tunes a Controller.
type Config struct {
	// PlatformNamespace holds every fabric-identity claim (the platform's
	// one project).
	PlatformNamespace string
	// ClassName is the claims' address class; empty leaves it to the
	// address service's default.
	ClassName string
	// Workers reconciling in parallel. Default DefaultWorkers.
	Workers int
	// Backoff bounds the per-network retry delay. Defaults 1 s and 5 min.
	BaseDelay, MaxDelay time.Duration
	// Claims, Allocations and Identities are informers' caches, read
	// instead of the API server where a stale answer is safe (docs/hub.md).
	// Nil reads through the API instead, one request per read, as a
	// controller without informers must.
	Claims      ClaimCache
	Allocations AllocationCache
	Identities  IdentityCache
	// Fence holds every write; nil is Unfenced.
	Fence Fence
	// Leases reports the address service's retention lease for the
	// claims' class and pools; nil: the service keeps retained blocks
	// forever. Releases are held while the lease is shorter than
	// MinRetentionLease, or cannot be read (lease.go).
	Leases            LeaseSource
	MinRetentionLease time.Duration
}

// DefaultWorkers reconcile in parallel by default. The collects of gone
// networks wait on one shared LIST that confirms them gone, so the
// workers are as many collects as one LIST answers: 16, as many as the
// startup sweep keeps in flight, make a release about one request. They
// cost nothing while idle, and the client's rate limiter, not their
// number, bounds what the controller asks of the API server.
const DefaultWorkers = 16

// Controller reconciles networks' fabric identities.
type Controller struct {
	api     API
	cache   NetworkCache
	place   Placement
	metrics *Metrics
	log     *slog.Logger
	cfg     Config
	queue   workqueue.TypedRateLimitingInterface[Key]

	// confirm batches the reads that confirm networks gone (confirm.go).
	confirm confirmer

	mu sync.Mutex
	// refused holds the claims whose release is currently kept or
	// refused, with that result: a retry that meets the same result again
	// is not a new release outcome and is not counted again.
	refused map[string]string
	// waiting holds the networks to try again as soon as a claim goes
	// away: refused by the quota, or waiting for their own claim's delete
	// to end.
	waiting map[Key]bool
	// claimGoneAt is when a claim was last deleted; see freedUnitWindow.
	claimGoneAt time.Time
	// unclaimed holds the live networks holding an adopted block with no
	// claim: the quota does not see them (issue 19, point 3).
	unclaimed map[Key]bool
	// refusedNets holds the live networks whose claim the address service
	// refuses now, with the class and cause, so that each is named once
	// per cause (event, metric, log) and not on every retry.
	refusedNets map[Key]refusal
	// quotaPoll paces the quick retries of a quota refusal after a unit
	// was freed (freedUnitWindow).
	quotaPoll workqueue.TypedRateLimiter[Key]
	// held is why releases are held now ("" when they are not), and
	// blind whether the claims read is proven empty by a scope; each
	// change of either is logged and recorded once.
	held  string
	blind bool
	// claimLost holds the live networks whose claim the address service
	// deleted in place of a gone one's and that have not been claimed for
	// again yet: ensure claims for them even while their identity exists,
	// which another writer may have written from the lost claim.
	claimLost map[Key]bool
}

// refusal is what refuses a network's claim: its class (Refusal*) and
// cause (Cause*, or the class again).
type refusal struct{ class, cause string }

// Refusal classes, the values of the class label.
const (
	RefusalConfiguration = "configuration" // a change of configuration mends it; retried slowly
	RefusalExhausted     = "exhausted"     // the address pool has no block left (507); retried slowly
	RefusalQuota         = "quota"         // the platform quota on claims is full; retried when a unit frees
)

// New returns a Controller. metrics may be nil; place nil means NoPlacement.
func New(api API, cache NetworkCache, place Placement, metrics *Metrics, log *slog.Logger, cfg Config) *Controller {
	if place == nil {
		place = NoPlacement{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Fence == nil {
		cfg.Fence = Unfenced{}
	}
	if cfg.BaseDelay <= 0 {
		cfg.BaseDelay = time.Second
	}
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = 5 * time.Minute
	}
	return &Controller{
		api: fenced{API: api, fence: cfg.Fence}, cache: cache, place: place, metrics: metrics, log: log, cfg: cfg,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[Key](cfg.BaseDelay, cfg.MaxDelay),
			workqueue.TypedRateLimitingQueueConfig[Key]{Name: "networks"}),
		refused: map[string]string{}, waiting: map[Key]bool{}, unclaimed: map[Key]bool{}, confirm: newConfirmer(),
		refusedNets: map[Key]refusal{}, claimLost: map[Key]bool{},
		quotaPoll: workqueue.NewTypedItemExponentialFailureRateLimiter[Key](freedUnitPoll, freedUnitPollMax),
	}
}

// Enqueue asks for namespace/name to be reconciled.
func (c *Controller) Enqueue(namespace, name string) { c.queue.Add(Key{namespace, name}) }

// ClaimBound is told that the claim of network namespace/name is bound: the
// network is reconciled now rather than when its backoff ends.
func (c *Controller) ClaimBound(namespace, name string) { c.Enqueue(namespace, name) }

// IdentityChanged is told, once the identity cache holds the change, that
// the fabric identity namespace/name was created, changed or deleted. The
// network is reconciled when the identity's presence and the network's
// disagree: an identity the cache had not seen yet when a collect skipped
// its delete brings the gone network back to be collected, and an identity
// deleted under a live network (a collect that raced the network's return,
// after its reconcile found the identity still cached) brings the network
// back to be given one again.
func (c *Controller) IdentityChanged(namespace, name string) {
	present := true
	if c.cfg.Identities != nil {
		_, present = c.cfg.Identities.Get(namespace, name)
	}
	if present != c.cache.Exists(namespace, name) {
		c.Enqueue(namespace, name)
	}
}

// ContextChanged is told that a context of network namespace/name was
// added, changed or deleted: its placement is brought to its locations.
func (c *Controller) ContextChanged(namespace, name string) {
	if c.cache.Exists(namespace, name) {
		c.Enqueue(namespace, name)
	}
}

// PolicyChanged is told that the placement policy of network
// namespace/name was written (present) or deleted. A live network is
// placed again, so that a policy changed or deleted by someone else is
// mended; a gone network whose policy appears (written before its collect
// could see it) is collected again. A gone network's policy deleted is the
// collect's own work: nothing to do.
func (c *Controller) PolicyChanged(namespace, name string, present bool) {
	if present || c.cache.Exists(namespace, name) {
		c.Enqueue(namespace, name)
	}
}

// ClaimGone is told that a claim was deleted, which may have freed a quota
// unit: every network refused for quota is tried again now. All of them,
// since which one the quota admits is the API server's race to decide; the
// losers are refused once more and back off as before. So is every network
// that waited for its own claim's delete to end.
func (c *Controller) ClaimGone() {
	c.mu.Lock()
	c.claimGoneAt = time.Now()
	waiting := make([]Key, 0, len(c.waiting))
	for k := range c.waiting {
		waiting = append(waiting, k)
	}
	c.mu.Unlock()
	for _, k := range waiting {
		c.queue.Add(k)
	}
}

// freedUnitWindow is how long after a claim is deleted a quota refusal is
// retried quickly, from freedUnitPoll doubling to freedUnitPollMax, rather
// than with backoff. The unit does not come back with the delete:
// kube-apiserver's ResourceQuota is recounted by its controller after the
// delete, and Milo's quota admission gives the unit back only when its
// garbage collector has removed the quota claim the IPClaim owned, which
// under load takes seconds. 30 s covers both; the doubling bounds the
// polling to about 20 creates per waiting network.
const (
	freedUnitWindow  = 30 * time.Second
	freedUnitPoll    = 100 * time.Millisecond
	freedUnitPollMax = 2 * time.Second
	// freedUnitPolls bounds the quick retries of one network until it is
	// claimed: under steady churn each delete opens the window again, and
	// without a bound every refused network would poll every 2 s for
	// ever, taking the client's rate from the releases that free units.
	// 20 polls cover one window.
	freedUnitPolls = 20
)

func (c *Controller) unitJustFreed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.claimGoneAt.IsZero() && time.Since(c.claimGoneAt) < freedUnitWindow
}

func (c *Controller) setUnclaimed(k Key, held bool) {
	c.mu.Lock()
	if held {
		c.unclaimed[k] = true
	} else {
		delete(c.unclaimed, k)
	}
	if c.metrics != nil {
		c.metrics.unclaimed.Set(float64(len(c.unclaimed)))
	}
	c.mu.Unlock()
}

// countUnclaimed rebuilds, on taking leadership, the set of live networks
// holding a block with no claim: those whose claim name's allocation is
// retained with no claimRef. Without it the gauge would read 0 after every
// restart while the blocks stay outside the quota.
func (c *Controller) countUnclaimed(ctx context.Context) {
	var allocs []Allocation
	if c.cfg.Allocations != nil {
		allocs = c.cfg.Allocations.List()
	} else {
		var err error
		if allocs, err = c.api.ListAllocations(ctx, c.cfg.PlatformNamespace); err != nil {
			c.log.Warn("could not list allocations to count unclaimed blocks", "error", err)
			return
		}
	}
	free := make(map[string]bool, len(allocs))
	for _, a := range allocs {
		if a.ClaimRef == "" {
			free[a.Name] = true
		}
	}
	unclaimed := map[Key]bool{}
	for _, k := range c.cache.Keys() {
		if free[AllocationName(c.cfg.PlatformNamespace, ClaimName(k.Namespace, k.Name))] {
			unclaimed[k] = true
		}
	}
	c.mu.Lock()
	c.unclaimed = unclaimed
	c.mu.Unlock()
	if c.metrics != nil {
		c.metrics.unclaimed.Set(float64(len(unclaimed)))
	}
}

func (c *Controller) setWaiting(k Key, waiting bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if waiting {
		c.waiting[k] = true
	} else {
		delete(c.waiting, k)
	}
}

// Run sweeps once, then reconciles queued networks until ctx ends. Call it
// on the leader only, after the network cache has synced.
func (c *Controller) Run(ctx context.Context) {
	defer c.queue.ShutDown()
	c.watchView(ctx)
	c.Sweep(ctx)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.Reconcile(ctx, key); err != nil {
		if errors.Is(err, ErrQuota) && c.unitJustFreed() && c.quotaPoll.NumRequeues(key) < freedUnitPolls {
			// The quota's usage is recounted after a claim is deleted, not
			// with it: a retry right after the delete can still be refused.
			// Poll briefly instead of backing off for minutes.
			c.queue.AddAfter(key, c.quotaPoll.When(key))
			return true
		}
		var config *ConfigError
		if errors.As(err, &config) || errors.Is(err, ErrExhausted) {
			// Named once already (refuse); a retry mends nothing until
			// someone changes the configuration or frees blocks.
			c.log.Debug("claim refused, retrying slowly", "network", key.String(), "error", err)
			c.queue.AddAfter(key, c.cfg.MaxDelay)
			return true
		}
		c.log.Warn("reconcile failed, retrying with backoff", "network", key.String(), "error", err,
			"retries", c.queue.NumRequeues(key))
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	c.quotaPoll.Forget(key)
	return true
}

// Reconcile brings one network's fabric identity to what the cache says: ensured
// for a live network, collected for a gone one.
func (c *Controller) Reconcile(ctx context.Context, key Key) error {
	if c.cache.Exists(key.Namespace, key.Name) {
		err := c.ensure(ctx, key)
		c.setWaiting(key, errors.Is(err, ErrQuota) || errors.Is(err, errClaimGoing))
		if err != nil {
			return err
		}
		c.setRefused(key, nil)
		// Placed only once it has its identity: a policy selecting no
		// object would place nothing.
		return c.place.Place(ctx, key)
	}
	c.setWaiting(key, false)
	c.setRefused(key, nil)
	result, err := c.collectCounted(ctx, key, false, false, nil)
	if err == nil && result != networkLives && result != releaseRestored {
		// Gone, and collected: it holds no block any more. One found
		// living may still hold an adopted block, and stays counted.
		c.setUnclaimed(key, false)
	}
	return err
}

// errNotBound: the claim exists but the address service has not bound it.
var errNotBound = errors.New("claim not bound yet")

// errClaimGoing: the network's claim is being deleted, released when an
// earlier network of the name was collected. Its block is not taken from
// it: once it is gone, the network adopts the retained allocation as any
// returning name does, and is counted as holding no claim.
var errClaimGoing = errors.New("claim is being deleted")

func (c *Controller) ensure(ctx context.Context, key Key) error {
	lost := c.isClaimLost(key)
	if exists, err := c.identityExists(ctx, key); err != nil {
		return err
	} else if exists && !lost {
		return nil // fabric identities are immutable: nothing to do
	}
	name := ClaimName(key.Namespace, key.Name)
	// Read past the cache: a claim the cache has not seen yet must not be
	// created twice, and one it still shows bound may be going.
	claim, err := c.api.GetClaim(ctx, c.cfg.PlatformNamespace, name)
	var block string
	switch {
	case err == nil:
		if claim.Deleting {
			c.finishReleasing(ctx, claim)
			return fmt.Errorf("claim %s of %s: %w; its block is adopted once it is gone", name, key, errClaimGoing)
		}
		if claim.Phase != "Bound" || claim.AllocatedCIDR == "" {
			return fmt.Errorf("claim %s of %s: %w (phase %q)", name, key, errNotBound, claim.Phase)
		}
		block = claim.AllocatedCIDR
	case errors.Is(err, ErrNotFound):
		block, err = c.claim(ctx, key, name)
		if err != nil {
			return err
		}
		if block == "" {
			return fmt.Errorf("claim %s of %s: %w", name, key, errNotBound)
		}
	default:
		return fmt.Errorf("read claim %s of %s: %w", name, key, err)
	}
	fabricID, err := FabricIDFromBlock(block)
	if err != nil {
		return fmt.Errorf("fabric ID of %s from claim %s: %w", key, name, err)
	}
	// A network that came back under its name holds its claim again: the
	// claim is no longer one of a gone network whose release is held up.
	c.forgetRelease(name)
	c.setClaimLost(key, false)
	err = c.api.CreateFabricIdentity(ctx, FabricIdentity{Namespace: key.Namespace, Name: key.Name, FabricID: fabricID, NetworkRef: key.Name})
	if errors.Is(err, ErrExists) {
		return nil // another writer was first; this one wrote nothing
	}
	if err != nil {
		return fmt.Errorf("write fabric identity of %s: %w", key, err)
	}
	if c.metrics != nil {
		c.metrics.identitiesMade.Inc()
	}
	c.log.Info("fabric identity written", "network", key.String(), "identity", fabricID, "block", block, "claim", name)
	return nil
}

// finishReleasing deletes again a claim ipam shows Releasing: its delete
// was asked for and published (TX1) but may not have ended, and ipam
// finishes it only when asked again (AllocatingREST.Delete retries its
// second transaction three times, then answers 500 and leaves the claim
// Releasing). A claim with a deletionTimestamp waits on finalizers that
// kube-apiserver itself ends: nothing to do.
func (c *Controller) finishReleasing(ctx context.Context, claim Claim) {
	if claim.Phase != PhaseReleasing {
		return
	}
	if _, err := c.api.DeleteClaim(ctx, c.cfg.PlatformNamespace, claim.Name, claim.UID, ""); err != nil && !errors.Is(err, ErrNotFound) {
		c.log.Warn("claim left Releasing; its delete failed again", "claim", claim.Name, "error", err)
	}
}

func (c *Controller) isClaimLost(key Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.claimLost[key]
}

func (c *Controller) setClaimLost(key Key, lost bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if lost {
		c.claimLost[key] = true
	} else {
		delete(c.claimLost, key)
	}
}

// identityExists reads whether the network has its fabric identity: from
// the identity cache when there is one. A cached identity may be one a
// collect has just deleted under a network that came back; its delete then
// reaches IdentityChanged, which reconciles the network again. A cached
// absence costs at most a create that finds the identity there.
func (c *Controller) identityExists(ctx context.Context, key Key) (bool, error) {
	if c.cfg.Identities != nil {
		_, ok := c.cfg.Identities.Get(key.Namespace, key.Name)
		return ok, nil
	}
	_, err := c.api.GetFabricIdentity(ctx, key.Namespace, key.Name)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNotFound):
		return false, nil
	}
	return false, fmt.Errorf("read fabric identity of %s: %w", key, err)
}

// claim creates the network's claim. It returns the block when it is known
// at once: bound by the create (ipam binds in the create's transaction, and
// from a41cd6f1 re-binds a retained allocation of the name), or from a
// retained allocation the address service points at, which is adopted
// instead of claiming a second block.
func (c *Controller) claim(ctx context.Context, key Key, name string) (string, error) {
	created, err := c.api.CreateClaim(ctx, Claim{
		Namespace: c.cfg.PlatformNamespace, Name: name, NetworkNamespace: key.Namespace, NetworkName: key.Name,
		ClassName: c.cfg.ClassName, PrefixLength: 64, ReclaimPolicy: PolicyRetain,
	})
	var retained *AllocationRetainedError
	var config *ConfigError
	switch {
	case err == nil:
		// The network holds a claim again, whether the block is new or a
		// retained one the create re-bound: the quota counts it.
		c.setUnclaimed(key, false)
		c.setClaimLost(key, false)
		c.log.Info("fabric identity claimed", "network", key.String(), "claim", name, "block", created.AllocatedCIDR)
		return created.AllocatedCIDR, nil
	case errors.As(err, &retained):
		// The seed's contract: 409 with cause AllocationRetained.
		alloc, err := c.api.GetAllocation(ctx, c.cfg.PlatformNamespace, retained.Allocation)
		if err != nil {
			return "", fmt.Errorf("adopt retained allocation %s for %s: %w", retained.Allocation, key, err)
		}
		return c.adopt(key, alloc), nil
	case errors.Is(err, ErrConflict):
		// A plain 409 (ipam at 012be054 for any retained allocation of the
		// name; at a41cd6f1 for one that does not fit the claim): the
		// allocation named after the claim says what it means. Retained
		// (Retain, no claimRef): the network's own block, adopted. Anything
		// else is a conflict no retry mends.
		allocName := AllocationName(c.cfg.PlatformNamespace, name)
		alloc, gerr := c.api.GetAllocation(ctx, c.cfg.PlatformNamespace, allocName)
		switch {
		case gerr == nil && alloc.ClaimRef == "" && alloc.ReclaimPolicy == PolicyRetain:
			return c.adopt(key, alloc), nil
		case gerr != nil && !errors.Is(gerr, ErrNotFound):
			return "", fmt.Errorf("claim %s for %s: %w; reading allocation %s to decide: %w", name, key, err, allocName, gerr)
		}
		why := fmt.Errorf("claim %s for %s: %w, and allocation %s is not a retained block to adopt", name, key, err, allocName)
		err = &ConfigError{Cause: CauseConflict, Err: why}
		c.refuse(ctx, key, refusal{RefusalConfiguration, CauseConflict}, err)
		return "", err
	case errors.Is(err, ErrQuota):
		if c.metrics != nil {
			c.metrics.quotaRefusals.Inc()
		}
		c.setRefused(key, &refusal{RefusalQuota, RefusalQuota})
		// The UID ties the event to this network and not to an earlier one
		// of the same name.
		c.api.Event(ctx, c.networkRef(key), true, "FabricIdentityQuotaExceeded",
			"the platform's quota on address claims refused claim "+name+"; retrying when a claim is released, else with backoff")
		return "", fmt.Errorf("claim %s for %s: %w", name, key, err)
	case errors.As(err, &config):
		err = fmt.Errorf("claim %s for %s: %w", name, key, err)
		c.refuse(ctx, key, refusal{RefusalConfiguration, config.Cause}, err)
		return "", err
	case errors.Is(err, ErrExhausted):
		err = fmt.Errorf("claim %s for %s: %w", name, key, err)
		c.refuse(ctx, key, refusal{RefusalExhausted, RefusalExhausted}, err)
		return "", err
	default:
		return "", fmt.Errorf("claim %s for %s: %w", name, key, err)
	}
}

// adopt takes a retained allocation of the network's claim name as its
// block, holding no claim: counted unclaimed.
func (c *Controller) adopt(key Key, alloc Allocation) string {
	c.log.Info("retained allocation adopted, no second block claimed", "network", key.String(),
		"allocation", alloc.Name, "block", alloc.AllocatedCIDR)
	c.setUnclaimed(key, true)
	c.setClaimLost(key, false)
	return alloc.AllocatedCIDR
}

// networkRef is the network for an event, with the cached UID.
func (c *Controller) networkRef(key Key) Network {
	uid, _ := c.cache.UID(key.Namespace, key.Name)
	return Network{Namespace: key.Namespace, Name: key.Name, UID: uid}
}

// refuse names a refusal of key's claim once per cause: a metric, a
// warning event on the network and a log line when the network first
// meets it; its retries stay quiet.
func (c *Controller) refuse(ctx context.Context, key Key, r refusal, err error) {
	if !c.setRefused(key, &r) {
		return
	}
	if c.metrics != nil {
		c.metrics.refusals.WithLabelValues(r.class, r.cause).Inc()
	}
	reason := "FabricIdentityClaimMisconfigured"
	if r.class == RefusalExhausted {
		reason = "FabricIdentityPoolExhausted"
	}
	c.log.Warn("claim refused; retrying slowly", "network", key.String(), "class", r.class, "cause", r.cause, "error", err)
	c.api.Event(ctx, c.networkRef(key), true, reason, fmt.Sprintf("%s (%s); retrying every %s: %v", r.class, r.cause, c.cfg.MaxDelay, err))
}

// setRefused records what refuses key's claim (nil: nothing) and reports
// whether that is a change.
func (c *Controller) setRefused(key Key, r *refusal) bool {
	c.mu.Lock()
	prev, had := c.refusedNets[key]
	changed := (r == nil) == had || (r != nil && prev != *r)
	if r == nil {
		delete(c.refusedNets, key)
	} else {
		c.refusedNets[key] = *r
	}
	if changed && c.metrics != nil {
		// Under the lock, so that the last count written is the last made.
		byClass := map[string]int{}
		for _, v := range c.refusedNets {
			byClass[v.class]++
		}
		for _, class := range []string{RefusalConfiguration, RefusalExhausted, RefusalQuota} {
			c.metrics.refusedNets.WithLabelValues(class).Set(float64(byClass[class]))
		}
	}
	c.mu.Unlock()
	return changed
}

// networkLives is collectCounted's result when the network the cache read
// as gone lives: nothing was collected.
const networkLives = "live"

// collectCounted takes a network the cache reads as gone: only after a read
// past the cache confirms it, the fabric identity, the placement and the
// claim are given back. It counts the claim's release on the sweep's metric
// when sweep is set and on the releases metric otherwise, never on both. It
// returns the release result: "" when nothing was released because there
// was no claim, networkLives when the network lives.
//
// confirmed: the sweep's own LIST of networks, made past the cache, lacked
// the network, which is not confirmed again. listed is the claim as the
// sweep listed it, if any. A stale listing is safe: the delete carries the
// listed UID and resourceVersion as preconditions.
func (c *Controller) collectCounted(ctx context.Context, key Key, sweep, confirmed bool, listed *Claim) (string, error) {
	if !confirmed {
		c.startCollect()
		defer c.endCollect()
		gone, err := c.confirmGone(ctx, key)
		switch {
		case err != nil:
			return c.failedBeforeRelease(sweep && listed != nil), fmt.Errorf("confirm %s is gone: %w: %w", key, errNotUnplaced, err)
		case !gone:
			c.log.Info("network the cache reads as gone still lives; nothing collected", "network", key.String())
			return networkLives, nil
		}
	}
	// A network the cache has seen come back since it read it as gone is
	// left to ensure, which its informer event has queued. One the cache
	// has not seen yet is collected and then given its identity again, from
	// its retained block (docs/hub.md). The sweep did not start from the
	// cache, so the cache's word there is no news: it collects on its LIST.
	if !confirmed && c.cache.Exists(key.Namespace, key.Name) {
		c.log.Info("network came back after it was confirmed gone; nothing collected", "network", key.String())
		return networkLives, nil
	}
	// An identity the cache has not seen is not deleted here: its add
	// reaches IdentityChanged, which brings the network back to be
	// collected.
	if c.identityMayExist(key) {
		if err := c.api.DeleteFabricIdentity(ctx, key.Namespace, key.Name); err != nil && !errors.Is(err, ErrNotFound) {
			return c.failedBeforeRelease(sweep && listed != nil), fmt.Errorf("delete fabric identity of %s: %w: %w", key, errNotUnplaced, err)
		}
	}
	// After the identity: a placement never outlives the object it places
	// in the seed's order, and a crash between the two leaves a policy
	// that selects nothing, which the next sweep removes.
	if err := c.place.Unplace(ctx, key); err != nil {
		return c.failedBeforeRelease(sweep && listed != nil), fmt.Errorf("%w: %w", errNotUnplaced, err)
	}
	name := ClaimName(key.Namespace, key.Name)
	result, claim, err := c.release(ctx, key, name, listed)
	if c.countRelease(name, result, sweep) {
		c.recordRelease(ctx, key, claim, result, err)
	}
	if err != nil {
		return result, fmt.Errorf("release claim of %s: %w", key, err)
	}
	return result, nil
}

// errNotUnplaced: a collect failed before its placement was removed.
var errNotUnplaced = errors.New("not unplaced")

// identityMayExist: without an identity cache, every collect deletes.
func (c *Controller) identityMayExist(key Key) bool {
	if c.cfg.Identities == nil {
		return true
	}
	_, ok := c.cfg.Identities.Get(key.Namespace, key.Name)
	return ok
}

// failedBeforeRelease: the claim was not reached. The sweep still counts the
// claim it looked at, as error; the releases metric counts releases tried,
// and none was.
func (c *Controller) failedBeforeRelease(sweep bool) string {
	if sweep && c.metrics != nil {
		c.metrics.sweep.WithLabelValues(ReleaseError).Inc()
	}
	return ReleaseError
}

// releaseNone is release's result when the gone network held no claim (it
// was refused by the quota, or adopted its block): nothing was released, so
// nothing is counted.
const releaseNone = ""

// releaseRestored is release's result when the server deleted a living
// network's claim in its place and the network was claimed for again
// (checkAfterDelete): nothing of the gone network's was released, and the
// network lives, holding what the new claim gave it.
const releaseRestored = "restored"

// release deletes a gone network's claim when its allocation is recorded
// Retain, with the claim's UID and resourceVersion as preconditions. The
// claim is the listed one, else the cached one, else read. A claim that
// changed since (ErrChanged) is read again past the cache, with its
// allocation, and released on that read once; one re-created since
// (ErrPrecondition) is not touched.
func (c *Controller) release(ctx context.Context, key Key, name string, listed *Claim) (string, Claim, error) {
	if !strings.HasPrefix(name, ClaimPrefix) {
		return ReleaseKept, Claim{}, fmt.Errorf("claim %s is not a fabric-identity claim: never touched", name)
	}
	claim, found, err := c.claimToRelease(ctx, name, listed)
	if err != nil {
		return ReleaseError, Claim{}, fmt.Errorf("read claim %s: %w", name, err)
	}
	if !found {
		return releaseNone, Claim{}, nil
	}
	result, err := c.releaseClaim(ctx, key, claim, false)
	if !errors.Is(err, ErrChanged) {
		return result, claim, err
	}
	c.log.Info("claim changed since it was read; deciding its release again on a fresh read", "claim", name, "error", err)
	seen := claim
	claim, err = c.api.GetClaim(ctx, c.cfg.PlatformNamespace, name)
	switch {
	case errors.Is(err, ErrNotFound):
		return releaseNone, seen, nil
	case err != nil:
		return ReleaseError, seen, fmt.Errorf("read claim %s again: %w", name, err)
	case claim.UID != seen.UID:
		// Deleted and made again since: whoever made it owns it, and this
		// collect confirmed its network gone before it existed.
		return ReleaseError, seen, fmt.Errorf("claim %s was re-created during release (uid %s, was %s); the new one is not deleted: %w", name, claim.UID, seen.UID, ErrPrecondition)
	}
	result, err = c.releaseClaim(ctx, key, claim, true)
	return result, claim, err
}

// claimToRelease returns the claim named name: the listed one, the cached
// one, or, without a claim cache, the one read. A claim the cache has not
// seen yet is released when its bind is seen (ClaimBound queues its
// network); one that never binds has no allocation and would be kept.
func (c *Controller) claimToRelease(ctx context.Context, name string, listed *Claim) (Claim, bool, error) {
	if listed != nil && listed.Name == name {
		return *listed, true, nil
	}
	if c.cfg.Claims != nil {
		claim, ok := c.cfg.Claims.Get(name)
		return claim, ok, nil
	}
	claim, err := c.api.GetClaim(ctx, c.cfg.PlatformNamespace, name)
	switch {
	case errors.Is(err, ErrNotFound):
		return Claim{}, false, nil
	case err != nil:
		return Claim{}, false, err
	}
	return claim, true, nil
}

// releaseClaim releases claim, of gone network key, as read; fresh reads
// its allocation past the cache.
func (c *Controller) releaseClaim(ctx context.Context, key Key, claim Claim, fresh bool) (string, error) {
	name := claim.Name
	if claim.Deleting && claim.Phase != PhaseReleasing {
		// An earlier pass released it and counted it; the address
		// service's finalizer is still settling the allocation.
		return releaseNone, nil
	}
	// A claim ipam shows Releasing is deleted again: its delete may have
	// stopped after publishing the phase (finishReleasing), and a repeated
	// delete is what ends it. One already gone is not counted again.
	releasing := claim.Phase == PhaseReleasing
	ns := c.cfg.PlatformNamespace
	allocName := claim.BoundAllocation
	if allocName == "" {
		allocName = AllocationName(ns, name)
	}
	alloc, err := c.allocationOf(ctx, allocName, name, fresh)
	switch {
	case errors.Is(err, ErrNotFound):
		return ReleaseKept, fmt.Errorf("claim %s kept: its allocation %s is missing, so nothing proves its block would stay retained", name, allocName)
	case err != nil:
		return ReleaseError, fmt.Errorf("read allocation %s of claim %s: %w", allocName, name, err)
	case alloc.ReclaimPolicy != PolicyRetain:
		return ReleaseKept, fmt.Errorf("claim %s kept: allocation %s is recorded reclaimPolicy %q, not Retain, so deleting the claim would free its block for reissue",
			name, allocName, alloc.ReclaimPolicy)
	}
	if err := c.releaseHold(ctx); err != nil {
		return ReleaseKept, fmt.Errorf("claim %s kept: %w", name, err)
	}
	deleted, err := c.api.DeleteClaim(ctx, ns, name, claim.UID, claim.ResourceVersion)
	switch {
	case err == nil && deleted != claim.UID:
		return c.checkAfterDelete(ctx, key, claim, deleted)
	case errors.Is(err, ErrNotFound) && releasing:
		return releaseNone, nil
	case err == nil, errors.Is(err, ErrNotFound):
		c.log.Info("fabric-identity claim released; its block stays retained", "claim", name, "allocation", allocName, "block", alloc.AllocatedCIDR)
		return ReleaseReleased, nil
	case errors.Is(err, ErrPrecondition):
		return ReleaseError, fmt.Errorf("claim %s was re-created during release; the new one is not deleted: %w", name, err)
	case errors.Is(err, ErrChanged):
		return ReleaseError, fmt.Errorf("claim %s changed during release: %w", name, err)
	case errors.Is(err, ErrRefused):
		return ReleaseRefused, fmt.Errorf("delete claim %s: %w", name, err)
	default:
		return ReleaseError, fmt.Errorf("delete claim %s: %w", name, err)
	}
}

// checkAfterDelete is the release's end when the server deleted a claim
// other than the one meant, or did not say which it deleted. A server that
// checks preconditions never does the first; ipam does not check them
// (AllocatingREST.Delete), so a claim made under the name since it was
// read — by a network of the name that came back — is deleted in its
// place. The network is read past the cache: gone, the claim deleted was
// another of its own; living, it has lost its claim, and a claim is made
// again at once (ipam re-binds the retained block: the same fabric ID),
// recorded by an event, a metric and a log line.
func (c *Controller) checkAfterDelete(ctx context.Context, key Key, meant Claim, deleted types.UID) (string, error) {
	name := meant.Name
	which := "a claim it did not name"
	if deleted != "" {
		which = "claim " + string(deleted)
	}
	gone, err := c.confirmGone(ctx, key)
	if err != nil {
		// Until a read says the network is gone, it may be a living one
		// whose claim was just taken: ensure claims for it however its
		// identity stands.
		c.setClaimLost(key, true)
		return ReleaseError, fmt.Errorf("claim %s: the server deleted %s, not %s; reading whether %s lives: %w", name, which, meant.UID, key, err)
	}
	if gone {
		c.log.Info("fabric-identity claim released; the server named another claim than the one read, and the network is gone", "claim", name,
			"meant_uid", meant.UID, "deleted", which)
		return ReleaseReleased, nil
	}
	c.log.Warn("the address service deleted a live network's claim in place of the gone one's: claiming again", "network", key.String(),
		"claim", name, "meant_uid", meant.UID, "deleted", which)
	c.setClaimLost(key, true)
	// Its identity may have gone with the collect: ensure writes it again
	// from the block claimed here, or claims again if this create fails.
	defer c.Enqueue(key.Namespace, key.Name)
	block, err := c.claim(ctx, key, name)
	if err != nil {
		c.api.Event(ctx, c.networkRef(key), true, "FabricIdentityClaimRestored",
			fmt.Sprintf("the address service deleted %s of this network (claim %s) in place of a gone network's claim (uid %s); claiming again failed, retrying: %v", which, name, meant.UID, err))
		return releaseRestored, fmt.Errorf("claim again for %s after its claim was deleted in place of another: %w", key, err)
	}
	if c.metrics != nil {
		c.metrics.restored.Inc()
	}
	c.api.Event(ctx, c.networkRef(key), true, "FabricIdentityClaimRestored",
		fmt.Sprintf("the address service deleted %s of this network (claim %s) in place of a gone network's claim (uid %s); claimed again at once, block %s", which, name, meant.UID, block))
	return releaseRestored, nil
}

// allocationOf returns the allocation allocName of claim: from the cache
// when it holds one that names the claim (its policy was fixed when the
// claim bound, so a cached one is as good as a read), else, or when fresh,
// read past the cache. An allocation the cache has not seen yet, or holds
// from another claim of the name, costs that read.
func (c *Controller) allocationOf(ctx context.Context, allocName, claim string, fresh bool) (Allocation, error) {
	if !fresh && c.cfg.Allocations != nil {
		if a, ok := c.cfg.Allocations.Get(allocName); ok && a.ClaimRef == claim {
			return a, nil
		}
	}
	return c.api.GetAllocation(ctx, c.cfg.PlatformNamespace, allocName)
}

// countRelease records a release result once: released each time a claim
// is deleted, error on each failed attempt, kept and refused only when a
// claim first meets that result, since the retries of a held-up release are
// not new releases. The sweep counts on its own metric alone. It reports
// whether the result is news: false for a kept or refused claim that met
// the same result last time.
func (c *Controller) countRelease(claim, result string, sweep bool) bool {
	c.mu.Lock()
	first := true
	switch result {
	case ReleaseKept, ReleaseRefused:
		first = c.refused[claim] != result
		c.refused[claim] = result
	case ReleaseReleased, releaseNone, releaseRestored:
		delete(c.refused, claim)
	}
	n := len(c.refused)
	c.mu.Unlock()
	if c.metrics == nil {
		return first
	}
	c.metrics.refused.Set(float64(n))
	// The sweep looks at each claim once, so it counts whatever it met:
	// a network claimed for again was found living.
	if result == releaseRestored && sweep {
		c.metrics.sweep.WithLabelValues("live").Inc()
		return first
	}
	if result == releaseNone || result == releaseRestored || (!first && !sweep) {
		return first
	}
	if sweep {
		c.metrics.sweep.WithLabelValues(result).Inc()
	} else {
		c.metrics.releases.WithLabelValues(result).Inc()
	}
	return first
}

// forgetRelease drops claim from the held-up releases: its network lives.
func (c *Controller) forgetRelease(claim string) {
	c.mu.Lock()
	_, held := c.refused[claim]
	delete(c.refused, claim)
	n := len(c.refused)
	c.mu.Unlock()
	if held && c.metrics != nil {
		c.metrics.refused.Set(float64(n))
	}
}

// Sweep collects, once, every network that a fabric-identity claim or a
// placement policy names and that one LIST of networks, made past the
// cache, lacks, so that a restart while a release or an unplace was
// failing leaks nothing: the claims and policies (from the caches when
// there are some), one LIST, then, per gone network, the deletes of its
// collect. Claims and policies of live networks, claims not named
// fabric-identity.* and policies without the placement label are left
// alone. The policies of the older per-location form are removed first.
// A network it cannot settle is queued for the workers.
func (c *Controller) Sweep(ctx context.Context) {
	c.countUnclaimed(ctx)
	c.removeLegacyPlacements(ctx)
	var claims []Claim
	if c.cfg.Claims != nil {
		claims = c.cfg.Claims.List()
	} else {
		var err error
		if claims, err = c.api.ListClaims(ctx, c.cfg.PlatformNamespace); err != nil {
			c.log.Warn("startup sweep could not list claims", "error", err)
			if c.metrics != nil {
				c.metrics.sweep.WithLabelValues(ReleaseError).Inc()
			}
			claims = nil
		}
	}
	// Each network once, with its claim if it has one, and whether a
	// policy places it.
	type owned struct {
		claim  *Claim
		placed bool
	}
	ours := map[Key]*owned{}
	var order []Key
	own := func(key Key) *owned {
		o, ok := ours[key]
		if !ok {
			o = &owned{}
			ours[key] = o
			order = append(order, key)
		}
		return o
	}
	for _, cl := range claims {
		if !strings.HasPrefix(cl.Name, ClaimPrefix) {
			continue
		}
		if key, ok := c.networkOfClaim(cl); ok {
			own(key).claim = &cl
		}
	}
	for _, key := range c.place.Placed() {
		own(key).placed = true
	}
	if len(order) == 0 {
		return
	}
	networks, err := c.api.ListNetworkKeys(ctx)
	if err != nil {
		// Nothing is collected on a failed read: each network is left to
		// the workers, which confirm it on a read of their own.
		c.log.Warn("startup sweep could not list networks; the workers retry each claim's and policy's network", "error", err)
		for _, key := range order {
			c.countSweep(ours[key].claim != nil, ours[key].placed, ReleaseError)
			c.queue.AddRateLimited(key)
		}
		return
	}
	live := make(map[Key]bool, len(networks))
	for _, k := range networks {
		live[k] = true
	}
	// Networks are settled concurrently, a few at a time: each takes a
	// round trip or two, and a hub restarting after an outage may find
	// thousands.
	sem := make(chan struct{}, sweepConcurrency)
	var wg sync.WaitGroup
	for _, key := range order {
		o := ours[key]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c.sweepNetwork(ctx, key, o.claim, o.placed, live[key])
		})
	}
	wg.Wait()
}

// removeLegacyPlacements removes the policies of the older per-location
// form, once, best effort: what fails is logged and counted, and tried
// again at the next start.
func (c *Controller) removeLegacyPlacements(ctx context.Context) {
	removed, failed := c.place.RemoveLegacy(ctx)
	if c.metrics != nil {
		c.metrics.sweepPolicies.WithLabelValues(SweepPolicyLegacyRemoved).Add(float64(removed))
		c.metrics.sweepPolicies.WithLabelValues(ReleaseError).Add(float64(failed))
	}
}

// countSweep counts a network the sweep looked at, on the claims' metric
// when it had a claim and on the policies' when a policy placed it. The
// claims' results are counted by collectCounted, but for the live and the
// unread.
func (c *Controller) countSweep(claim, placed bool, result string) {
	if c.metrics == nil {
		return
	}
	if claim && (result == "live" || result == ReleaseError) {
		c.metrics.sweep.WithLabelValues(result).Inc()
	}
	if placed {
		c.metrics.sweepPolicies.WithLabelValues(result).Inc()
	}
}

// sweepConcurrency: 16 claims in flight keep the API server busy while
// each waits on its round trip; at 8, releasing 1,000 claims took 1.4x
// bare deletes, at 16 about 1x to 1.2x (BenchmarkRelease1000ClaimsOfGoneNetworks).
const sweepConcurrency = 16

// networkOfClaim is the network a claim was made for, from its annotations
// or else its name; a claim that names none, or another network than its
// name does, is left alone.
func (c *Controller) networkOfClaim(cl Claim) (Key, bool) {
	ns, name := cl.NetworkNamespace, cl.NetworkName
	if ns == "" || name == "" {
		var ok bool
		if ns, name, ok = NetworkOfClaim(cl.Name); !ok {
			c.log.Warn("startup sweep: claim names no network; left alone", "claim", cl.Name)
			return Key{}, false
		}
	}
	if ClaimName(ns, name) != cl.Name {
		c.log.Warn("startup sweep: claim does not match the network it names; left alone", "claim", cl.Name, "network", ns+"/"+name)
		return Key{}, false
	}
	return Key{ns, name}, true
}

func (c *Controller) sweepNetwork(ctx context.Context, key Key, cl *Claim, placed, live bool) {
	if live {
		c.countSweep(cl != nil, placed, "live")
		return
	}
	// collectCounted counts the claim on the sweep's metric, with the
	// result the release met: kept, refused, released or error.
	_, err := c.collectCounted(ctx, key, true, true, cl)
	if placed {
		// The policy is removed once the collect is past its unplace,
		// whatever the claim's release met after.
		result := SweepPolicyRemoved
		if errors.Is(err, errNotUnplaced) {
			result = ReleaseError
		}
		c.countSweep(false, true, result)
	}
	if err != nil {
		c.log.Warn("startup sweep: collect failed, retrying with backoff", "network", key.String(), "error", err)
		c.queue.AddRateLimited(key)
	}
}

// RefusedClaims returns the claims whose release is currently kept or
// refused.
func (c *Controller) RefusedClaims() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.refused)
}
