package hubctl

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
)

// BreakDirectRead, BreakRetainCheck and BreakRelease switch off a check or
// the release itself: the deliberately broken variants the chaos suite must
// catch. They wrap the controller's API and caches, so the product carries
// no switch for them.
func (c *Controller) BreakDirectRead() { c.api = goneNetworks{c.api} }

func (c *Controller) BreakRetainCheck() {
	c.api = retainedAllocations{c.api}
	if c.cfg.Allocations != nil {
		c.cfg.Allocations = retainedCache{c.cfg.Allocations}
	}
}

func (c *Controller) BreakRelease() { c.api = undeletedClaims{c.api} }

// BreakCheckAfterDelete makes every claim delete answer the UID it was
// asked for, as if the server had deleted exactly that claim: the check of
// what a server that ignores preconditions deleted never runs.
func (c *Controller) BreakCheckAfterDelete() { c.api = meantDeleted{c.api} }

type meantDeleted struct{ API }

func (m meantDeleted) DeleteClaim(ctx context.Context, ns, name string, uid types.UID, rv string) (types.UID, error) {
	_, err := m.API.DeleteClaim(ctx, ns, name, uid, rv)
	return uid, err
}

// goneNetworks reads every network as gone: the read past the cache
// confirms whatever the cache says.
type goneNetworks struct{ API }

func (goneNetworks) GetNetwork(context.Context, string, string) (Network, error) {
	return Network{}, ErrNotFound
}

func (goneNetworks) ListNetworkKeys(context.Context) ([]Key, error) { return nil, nil }

// retainedAllocations reads every allocation as recorded Retain.
type retainedAllocations struct{ API }

func (r retainedAllocations) GetAllocation(ctx context.Context, namespace, name string) (Allocation, error) {
	a, err := r.API.GetAllocation(ctx, namespace, name)
	if err == nil {
		a.ReclaimPolicy = PolicyRetain
	}
	return a, err
}

// retainedCache caches every allocation as recorded Retain.
type retainedCache struct{ AllocationCache }

func (r retainedCache) Get(name string) (Allocation, bool) {
	a, ok := r.AllocationCache.Get(name)
	if ok {
		a.ReclaimPolicy = PolicyRetain
	}
	return a, ok
}

// undeletedClaims accepts every claim delete and deletes nothing.
type undeletedClaims struct{ API }

func (undeletedClaims) DeleteClaim(_ context.Context, _, _ string, uid types.UID, _ string) (types.UID, error) {
	return uid, nil
}
