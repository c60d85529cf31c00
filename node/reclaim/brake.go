package reclaim

import (
	"fmt"
	"slices"
	"time"
)

// The brake stops a pass from removing a mass of taps at once. One rule,
// "no object carries the identity", cannot tell a tenant that left from a
// cluster that lost its objects by accident (a CRD deleted and reinstalled,
// a namespace deleted, `kubectl delete --all`), and the second kind of
// accident takes every unheld tap of the node in one pass: a VM whose VMM is
// restarting or migrating loses its tap. Kubernetes' node lifecycle
// controller meets the same doubt the same way: when more than
// --unhealthy-zone-threshold (55%) of a zone's nodes, and more than two,
// look unhealthy at once, it stops evicting, since a fault of its own view
// is then likelier than a mass failure.
//
// A pass engages the brake, and removes nothing, when its confirmed taps
// are at least MassRemovalMin and more than MassRemovalShare of the node's
// stamped taps, or when the identities the inventory carries fell, since
// their peak within ShrinkWindow, by at least MassRemovalMin and more than
// InventoryShrinkShare of that peak while the pass had taps to remove. Once
// engaged it holds, across passes, until released: by an operator
// (PassOptions.AllowMassRemoval), on its own once the inventory has not
// shrunk further for BrakeReleaseAfter, or when no candidate is left to
// hold (the objects came back). A release accepts the candidates of
// that moment: they go at the per-pass cap's pace, and the brake weighs only
// taps found stale after it.

// Brake defaults.
const (
	DefaultMassRemovalShare     = 0.5
	DefaultMassRemovalMin       = 3
	DefaultInventoryShrinkShare = 0.5
	DefaultShrinkWindow         = time.Hour
	DefaultBrakeReleaseAfter    = time.Hour
	// DefaultMaxReclaimsPerPass paces even a released mass removal: at
	// one pass a minute, ten taps a minute.
	DefaultMaxReclaimsPerPass = 10
)

// maxShrinkSamples bounds the inventory sizes kept for the shrink rule, so
// that forced passes in a loop cannot grow it: the oldest go first.
const maxShrinkSamples = 512

// Brake is the mass-removal brake's state, for views.
type Brake struct {
	Engaged bool `json:"engaged"`
	// Since is when the brake engaged; Reason says which rule engaged it.
	Since  time.Time `json:"since,omitzero"`
	Reason string    `json:"reason,omitempty"`
	// Held is how many confirmed taps the last braked pass kept.
	Held int `json:"held"`
	// ReleasesAt is when the brake releases on its own if the inventory
	// shrinks no further meanwhile; zero when it never does.
	ReleasesAt time.Time `json:"releasesAt,omitzero"`
	// LastRelease says how the brake was last released, and when.
	LastRelease   string    `json:"lastRelease,omitempty"`
	LastReleaseAt time.Time `json:"lastReleaseAt,omitzero"`
}

// BrakeReport is what the brake did in one pass.
type BrakeReport struct {
	// Engaged: the pass removed nothing because of the brake.
	Engaged bool   `json:"engaged"`
	Reason  string `json:"reason,omitempty"`
	// Held counts the confirmed taps kept by the brake.
	Held int `json:"held,omitempty"`
	// Released says the brake was released by this pass, and how.
	Released string `json:"released,omitempty"`
}

type sizeSample struct {
	at         time.Time
	identities int
}

// brakeState is the brake's memory between passes; only passes touch it,
// under passMu, and views read a copy under mu.
type brakeState struct {
	view Brake
	// lowest is the fewest identities seen since the brake engaged, and
	// lowestAt when that was: the clock of the release on its own.
	lowest   int
	lowestAt time.Time
	// sizes are the identities of recent healthy passes, oldest first.
	sizes []sizeSample
	// accepted holds the candidates a release accepted, by ifindex and the
	// identity, name and owner they had then.
	accepted map[uint32]candidate
}

// observeSize records a healthy pass's inventory size and returns the peak
// within the shrink window, before it.
func (r *Reclaimer) observeSize(now time.Time, identities int) (peak int) {
	b := &r.brake
	cut := 0
	for cut < len(b.sizes) && now.Sub(b.sizes[cut].at) > r.cfg.ShrinkWindow {
		cut++
	}
	b.sizes = b.sizes[cut:]
	for _, s := range b.sizes {
		peak = max(peak, s.identities)
	}
	if len(b.sizes) >= maxShrinkSamples {
		b.sizes = slices.Delete(b.sizes, 0, len(b.sizes)-maxShrinkSamples+1)
	}
	b.sizes = append(b.sizes, sizeSample{now, identities})
	return peak
}

// brakeRule returns why a pass with these confirmed taps must not remove
// any, or "" when it may. Taps a release accepted are not counted.
func (r *Reclaimer) brakeRule(confirmed []candidate, stamped, peak, identities int) string {
	weighed := 0
	for _, c := range confirmed {
		if a, ok := r.brake.accepted[c.Ifindex]; !ok || a.Expect() != c.Expect() {
			weighed++
		}
	}
	if weighed == 0 {
		return ""
	}
	min := r.cfg.MassRemovalMin
	if share := r.cfg.MassRemovalShare; share < 1 && weighed >= min && float64(weighed) > share*float64(stamped) {
		return fmt.Sprintf("%d of the node's %d stamped taps confirmed stale at once (more than %.0f%%, and at least %d)",
			weighed, stamped, share*100, min)
	}
	if share := r.cfg.InventoryShrinkShare; share < 1 && peak-identities >= min && float64(peak-identities) > share*float64(peak) {
		return fmt.Sprintf("the identities the cluster carries fell from %d to %d within %s (more than %.0f%%, and at least %d)",
			peak, identities, r.cfg.ShrinkWindow, share*100, min)
	}
	return ""
}

// applyBrake decides, for a pass with these confirmed taps and the
// candidates it tracks from now on, whether the brake keeps them all. It
// returns the report of what it did; Engaged means remove nothing.
func (r *Reclaimer) applyBrake(now time.Time, confirmed []candidate, next map[uint32]candidate, stamped, peak, identities int, opts PassOptions) BrakeReport {
	b := &r.brake
	// Accepted candidates that are no longer candidates (removed, held
	// again, their identity carried again) are no longer accepted.
	for ix, a := range b.accepted {
		if c, ok := next[ix]; !ok || c.Expect() != a.Expect() {
			delete(b.accepted, ix)
		}
	}
	var rep BrakeReport
	if b.view.Engaged {
		if identities < b.lowest {
			b.lowest, b.lowestAt = identities, now
			if r.cfg.BrakeReleaseAfter > 0 {
				b.view.ReleasesAt = now.Add(r.cfg.BrakeReleaseAfter)
			}
		}
		switch {
		case opts.AllowMassRemoval && !opts.DryRun:
			rep.Released = r.releaseBrake(now, next, "by an operator (allow mass removal)")
		case len(next) == 0:
			// The objects came back (or the taps went): nothing is left
			// to hold, and a tap found stale later is weighed afresh.
			rep.Released = r.releaseBrake(now, next, "on its own: no candidate left to hold")
		case r.cfg.BrakeReleaseAfter > 0 && !now.Before(b.view.ReleasesAt):
			rep.Released = r.releaseBrake(now, next, fmt.Sprintf("on its own: the inventory shrank no further for %s", r.cfg.BrakeReleaseAfter))
		default:
			b.view.Held = len(confirmed)
			return BrakeReport{Engaged: true, Reason: b.view.Reason, Held: len(confirmed)}
		}
	}
	why := r.brakeRule(confirmed, stamped, peak, identities)
	if why == "" {
		return rep
	}
	if opts.AllowMassRemoval {
		if !opts.DryRun {
			rep.Released = r.releaseBrake(now, next, "by an operator (allow mass removal) before it engaged: "+why)
		}
		return rep
	}
	b.view = Brake{Engaged: true, Since: now, Reason: why, Held: len(confirmed), LastRelease: b.view.LastRelease, LastReleaseAt: b.view.LastReleaseAt}
	b.lowest, b.lowestAt = identities, now
	if r.cfg.BrakeReleaseAfter > 0 {
		b.view.ReleasesAt = now.Add(r.cfg.BrakeReleaseAfter)
	}
	r.log.Warn("mass-removal brake engaged: passes remove nothing until it is released",
		"reason", why, "held", len(confirmed), "releases_at", b.view.ReleasesAt,
		"release", "galactic-node pass --allow-mass-removal")
	return BrakeReport{Engaged: true, Reason: why, Held: len(confirmed)}
}

// releaseBrake releases the brake, accepting every candidate tracked now,
// and forgets the inventory's past sizes, so that neither rule engages it
// again for what was accepted.
func (r *Reclaimer) releaseBrake(now time.Time, next map[uint32]candidate, how string) string {
	b := &r.brake
	if b.accepted == nil {
		b.accepted = make(map[uint32]candidate)
	}
	for ix, c := range next {
		b.accepted[ix] = c
	}
	b.sizes = nil
	b.view = Brake{LastRelease: how, LastReleaseAt: now}
	r.log.Warn("mass-removal brake released", "how", how, "accepted", len(next))
	return how
}

// Brake returns the brake's state.
func (r *Reclaimer) Brake() Brake {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.brakeView
}

// publishBrake copies the brake's state for views.
func (r *Reclaimer) publishBrake() {
	r.mu.Lock()
	r.brakeView = r.brake.view
	r.mu.Unlock()
}
