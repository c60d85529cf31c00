package hubctl

import (
	"context"
	"time"
)

// Blind reports whether the claims the controller reads are proven not
// to be the platform's: fabric identities exist, each made from a block
// of a claim, yet neither a claim nor an allocation is in view. ipam
// answers a LIST or WATCH that carries no project scope with an empty
// result, not an error (internal/storage/postgres/store.go: the unscoped
// key prefix holds nothing), so a hub whose credentials are not the
// platform project's syncs empty caches and would otherwise call itself
// ready. Without caches, or with no identity yet, nothing proves it
// either way: not blind.
func (c *Controller) Blind() bool {
	identities, ok := c.cfg.Identities.(counted)
	if !ok || c.cfg.Claims == nil || c.cfg.Allocations == nil {
		return false
	}
	return identities.Len() > 0 && size(c.cfg.Claims, func() int { return len(c.cfg.Claims.List()) }) == 0 &&
		size(c.cfg.Allocations, func() int { return len(c.cfg.Allocations.List()) }) == 0
}

// counted is a cache that counts what it holds without copying it.
type counted interface{ Len() int }

// size is cache's count: its own, or else what list counts.
func size(cache any, list func() int) int {
	if n, ok := cache.(counted); ok {
		return n.Len()
	}
	return list()
}

// viewEvery is how often the leader looks at its view of claims and at
// the release hold, so that both are exported and recorded even when no
// release is tried.
const viewEvery = 10 * time.Second

// watchView checks, now and every viewEvery until ctx ends, whether the
// controller is blind to its claims and whether releases are held,
// logging, counting and recording each change once.
func (c *Controller) watchView(ctx context.Context) {
	check := func() {
		blind := c.Blind()
		c.mu.Lock()
		changed := blind != c.blind
		c.blind = blind
		c.mu.Unlock()
		if changed {
			c.reportBlind(ctx, blind)
		}
		_ = c.releaseHold(ctx)
	}
	check()
	go func() {
		t := time.NewTicker(viewEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				check()
			}
		}
	}()
}

func (c *Controller) reportBlind(ctx context.Context, blind bool) {
	if c.metrics != nil {
		c.metrics.blind.Set(boolGauge(blind))
	}
	if !blind {
		c.log.Info("claims in view again")
		return
	}
	msg := "fabric identities exist but no claim or allocation is in view in namespace " + c.cfg.PlatformNamespace +
		": the hub's credentials are likely not scoped to the platform project (the address service answers an unscoped read with an empty list); not ready, and nothing can be released"
	c.log.Error("blind to claims", "why", msg)
	c.api.HubEvent(ctx, true, "FabricIdentityClaimsNotVisible", msg)
}

// Status is what the controller says of itself on /status.
type Status struct {
	// Promise is what the hub promises of a released block now.
	Promise string `json:"promise"`
	// MinRetentionLease is the floor under which releases are held.
	MinRetentionLease string `json:"minRetentionLease"`
	// ReleasesHeld says why no claim is released now; empty when they are.
	ReleasesHeld string `json:"releasesHeld,omitempty"`
	// Blind: claims are not in view (Blind).
	Blind bool `json:"blind"`
	// Refused counts the live networks whose claim is refused, by class.
	Refused map[string]int `json:"refused"`
	// Unclaimed counts live networks holding an adopted block.
	Unclaimed int `json:"unclaimed"`
}

// Status returns the controller's status.
func (c *Controller) Status() Status {
	st := Status{Promise: c.promise(), MinRetentionLease: c.cfg.MinRetentionLease.String(), ReleasesHeld: c.holdReason(),
		Blind: c.Blind(), Refused: map[string]int{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.refusedNets {
		st.Refused[r.class]++
	}
	st.Unclaimed = len(c.unclaimed)
	return st
}
