package reclaim

import (
	"fmt"
	"maps"
	"reflect"
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
// A pass that has taps to remove engages the brake, and removes nothing,
// when the taps it finds stale (confirmed, awaiting confirmation, or shown
// stale only by the API server's consistent read) are at least
// MassRemovalMin and more than MassRemovalShare of the node's stamped
// taps, or when the identities the inventory carries fell, since
// their peak within ShrinkWindow, by at least MassRemovalMin and more than
// InventoryShrinkShare of that peak while the pass had taps to remove. Once
// engaged it holds, across passes, until released: by an operator
// (PassOptions.AllowMassRemoval), on its own once the inventory has not
// shrunk further for BrakeReleaseAfter, or when no candidate is left to
// hold (the objects came back). A release accepts the candidates of
// that moment: they go at the per-pass cap's pace, and the brake weighs only
// taps found stale after it. Every release by an operator, whether or not
// the brake was engaged, also resets the inventory's peak to its size then.
//
// Small inventories are treated apart, as the node lifecycle controller
// treats clusters of at most --large-cluster-size-threshold (50) nodes: in a
// cluster of a few tenants, the departure of three of five looks to the
// shrink rule like a deleted CRD, and it would hold every later removal,
// even of a single tap, until released. Below LargeInventory identities at
// the peak the shrink rule weighs only a pass that would remove at least
// MassRemovalMin taps: a mass on its own. A single departure goes; a
// deleted CRD, which leaves every tap of the tenants on the node stale at
// once, is still held (and so is any such mass, by the share rule).
//
// The brake's memory (BrakeMemory) outlives the daemon when Config.Memory
// is set: a restart, an OOM kill or a rollout during an incident must not
// release it.

// Brake defaults.
const (
	DefaultMassRemovalShare     = 0.5
	DefaultMassRemovalMin       = 3
	DefaultInventoryShrinkShare = 0.5
	DefaultShrinkWindow         = time.Hour
	DefaultBrakeReleaseAfter    = time.Hour
	// DefaultLargeInventory is --large-cluster-size-threshold's default:
	// below it, the shrink rule weighs only a mass on its own.
	DefaultLargeInventory = 50
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
	// MemoryError says why the brake's memory could not be saved the
	// last time it changed: a restart now would forget what changed.
	MemoryError string `json:"memoryError,omitempty"`
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

// SizeSample is the identities a healthy pass's inventory carried.
type SizeSample struct {
	At         time.Time `json:"at"`
	Identities int       `json:"identities"`
}

// AcceptedTap is a candidate a release accepted: its ifindex, identity,
// name and owner as they were then.
type AcceptedTap struct {
	Tap       TapRef    `json:"tap"`
	FirstSeen time.Time `json:"firstSeen"`
}

// BrakeMemory is everything the brake decides from besides a pass's own
// inputs: its view, the fewest identities since it engaged (the clock of
// the release on its own), the samples that hold the inventory's peak, and
// what a release accepted.
type BrakeMemory struct {
	Brake    Brake         `json:"brake"`
	Lowest   int           `json:"lowest"`
	LowestAt time.Time     `json:"lowestAt,omitzero"`
	Sizes    []SizeSample  `json:"sizes"`
	Accepted []AcceptedTap `json:"accepted"`
}

// BrakeMemoryStore keeps the brake's memory where a restart finds it; the
// daemon's is a file on the node (brakefile.File). Save is called after
// each pass that changed the memory; an error is logged and the pass goes
// on, since the memory in the daemon is still right.
type BrakeMemoryStore interface {
	Save(BrakeMemory) error
}

// brakeState is the brake's memory between passes; only passes touch it,
// under passMu, and views read a copy under mu.
type brakeState struct {
	view Brake
	// lowest is the fewest identities seen since the brake engaged, and
	// lowestAt when that was: the clock of the release on its own.
	lowest   int
	lowestAt time.Time
	// sizes are the identities of recent healthy passes, oldest first,
	// each larger than every later one: a sample that a later one
	// equals or exceeds can never again be the window's peak, since the
	// later one leaves the window after it.
	sizes []SizeSample
	// accepted holds the candidates a release accepted, by ifindex and the
	// identity, name and owner they had then.
	accepted map[uint32]candidate
	// saved is the memory last written to Config.Memory.
	saved *BrakeMemory
}

// observeSize records a healthy pass's inventory size and returns the peak
// within the shrink window, before it.
func (r *Reclaimer) observeSize(now time.Time, identities int) (peak int) {
	b := &r.brake
	cut := 0
	for cut < len(b.sizes) && now.Sub(b.sizes[cut].At) > r.cfg.ShrinkWindow {
		cut++
	}
	b.sizes = b.sizes[cut:]
	if len(b.sizes) > 0 {
		peak = b.sizes[0].Identities
	}
	for len(b.sizes) > 0 && b.sizes[len(b.sizes)-1].Identities <= identities {
		b.sizes = b.sizes[:len(b.sizes)-1]
	}
	if len(b.sizes) >= maxShrinkSamples {
		b.sizes = slices.Delete(b.sizes, 0, len(b.sizes)-maxShrinkSamples+1)
	}
	b.sizes = append(b.sizes, SizeSample{now, identities})
	return peak
}

// brakeRule returns why a pass with these confirmed taps must not remove
// any, or "" when it may. It weighs every stale tap of the pass, not only
// the confirmed ones: the candidates next tracks, seen stale once or more,
// and staleByProof, the taps only the API server's consistent read shows
// stale. A mass deletion reaches a node over several passes (a watch that
// lags, a namespace that deletes its objects in turn), and a rule that
// weighed only each pass's confirmed taps would let it go in parts. Taps a
// release accepted are not counted, and a pass that confirms none of the
// others removes nothing for the brake to stop.
func (r *Reclaimer) brakeRule(confirmed []candidate, next map[uint32]candidate, staleByProof, stamped, peak, identities int) string {
	unaccepted := func(c candidate) bool {
		a, ok := r.brake.accepted[c.Ifindex]
		return !ok || a.Expect() != c.Expect()
	}
	if !slices.ContainsFunc(confirmed, unaccepted) {
		return ""
	}
	weighed := staleByProof
	for _, c := range next {
		if unaccepted(c) {
			weighed++
		}
	}
	min := r.cfg.MassRemovalMin
	if share := r.cfg.MassRemovalShare; share < 1 && weighed >= min && float64(weighed) > share*float64(stamped) {
		return fmt.Sprintf("%d of the node's %d stamped taps found stale at once (more than %.0f%%, and at least %d)",
			weighed, stamped, share*100, min)
	}
	small := peak < r.cfg.LargeInventory && weighed < min
	if share := r.cfg.InventoryShrinkShare; share < 1 && !small && peak-identities >= min && float64(peak-identities) > share*float64(peak) {
		return fmt.Sprintf("the identities the cluster carries fell from %d to %d within %s (more than %.0f%%, and at least %d)",
			peak, identities, r.cfg.ShrinkWindow, share*100, min)
	}
	return ""
}

// applyBrake decides, for a pass with these confirmed taps and the
// candidates it tracks from now on, whether the brake keeps them all. It
// returns the report of what it did; Engaged means remove nothing.
func (r *Reclaimer) applyBrake(now time.Time, confirmed []candidate, next map[uint32]candidate, staleByProof, stamped, peak, identities int, opts PassOptions) BrakeReport {
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
		case opts.AllowMassRemoval && (!opts.DryRun || opts.preview):
			// A preview releases too, to show what the release would
			// remove: Pass puts the memory back. A daemon in dry-run
			// keeps its brake: nothing is removed to release.
			rep.Released = r.releaseBrake(now, next, opts.preview, "by an operator (allow mass removal)")
		case len(next) == 0:
			// The objects came back (or the taps went): nothing is left
			// to hold, and a tap found stale later is weighed afresh.
			rep.Released = r.releaseBrake(now, next, opts.preview, "on its own: no candidate left to hold")
		case r.cfg.BrakeReleaseAfter > 0 && !now.Before(b.view.ReleasesAt):
			rep.Released = r.releaseBrake(now, next, opts.preview, fmt.Sprintf("on its own: the inventory shrank no further for %s", r.cfg.BrakeReleaseAfter))
		default:
			b.view.Held = len(confirmed)
			return BrakeReport{Engaged: true, Reason: b.view.Reason, Held: len(confirmed)}
		}
	}
	why := r.brakeRule(confirmed, next, staleByProof, stamped, peak, identities)
	if why == "" {
		if opts.AllowMassRemoval && (!opts.DryRun || opts.preview) && rep.Released == "" {
			// The operator's word covers the departures behind the
			// peak too: without this, a shrink they just judged
			// ordinary would hold the next removal.
			rep.Released = r.releaseBrake(now, next, opts.preview, "by an operator (allow mass removal): nothing was held; the inventory's peak was reset")
		}
		return rep
	}
	if opts.AllowMassRemoval {
		if !opts.DryRun || opts.preview {
			rep.Released = r.releaseBrake(now, next, opts.preview, "by an operator (allow mass removal) before it engaged: "+why)
		}
		return rep
	}
	b.view = Brake{Engaged: true, Since: now, Reason: why, Held: len(confirmed), LastRelease: b.view.LastRelease, LastReleaseAt: b.view.LastReleaseAt}
	b.lowest, b.lowestAt = identities, now
	if r.cfg.BrakeReleaseAfter > 0 {
		b.view.ReleasesAt = now.Add(r.cfg.BrakeReleaseAfter)
	}
	if opts.preview {
		// Pass puts the memory back: nothing engaged to tell of.
		return BrakeReport{Engaged: true, Reason: why, Held: len(confirmed)}
	}
	r.log.Warn("mass-removal brake engaged: passes remove nothing until it is released",
		"reason", why, "held", len(confirmed), "releases_at", b.view.ReleasesAt,
		"release", "galactic-node pass --allow-mass-removal")
	if r.events != nil {
		r.events.BrakeEngaged(b.view)
	}
	return BrakeReport{Engaged: true, Reason: why, Held: len(confirmed)}
}

// releaseBrake releases the brake, accepting every candidate tracked now,
// and forgets the inventory's past sizes, so that neither rule engages it
// again for what was accepted. A preview's release is told to no one: Pass
// puts the memory back.
func (r *Reclaimer) releaseBrake(now time.Time, next map[uint32]candidate, preview bool, how string) string {
	b := &r.brake
	if b.accepted == nil {
		b.accepted = make(map[uint32]candidate)
	}
	for ix, c := range next {
		b.accepted[ix] = c
	}
	// The peak restarts from this pass's size (the newest sample): a
	// shrink after the release is weighed afresh.
	b.sizes = b.sizes[max(len(b.sizes)-1, 0):]
	b.view = Brake{LastRelease: how, LastReleaseAt: now}
	if preview {
		return how
	}
	r.log.Warn("mass-removal brake released", "how", how, "accepted", len(next))
	if r.events != nil {
		r.events.BrakeReleased(how, len(next))
	}
	return how
}

// clone returns a copy of b that shares nothing it changes: observeSize
// writes into sizes' array and applyBrake into accepted.
func (b *brakeState) clone() brakeState {
	c := *b
	c.sizes = slices.Clone(b.sizes)
	c.accepted = maps.Clone(b.accepted)
	return c
}

// memory returns the brake's memory as a store keeps it.
func (b *brakeState) memory() BrakeMemory {
	m := BrakeMemory{Brake: b.view, Lowest: b.lowest, LowestAt: b.lowestAt, Sizes: slices.Clone(b.sizes), Accepted: []AcceptedTap{}}
	if m.Sizes == nil {
		m.Sizes = []SizeSample{}
	}
	for _, ix := range slices.Sorted(maps.Keys(b.accepted)) {
		c := b.accepted[ix]
		m.Accepted = append(m.Accepted, AcceptedTap{Tap: c.TapRef, FirstSeen: c.firstSeen})
	}
	return m
}

// RestoreBrake gives the reclaimer the brake's memory a store kept, before
// its first pass: an engaged brake stays engaged, with its reason and
// since, and the inventory's peak and what a release accepted stay.
func (r *Reclaimer) RestoreBrake(m BrakeMemory) {
	r.passMu.Lock()
	defer r.passMu.Unlock()
	b := &r.brake
	b.view, b.lowest, b.lowestAt = m.Brake, m.Lowest, m.LowestAt
	b.sizes = slices.Clone(m.Sizes)
	b.accepted = make(map[uint32]candidate, len(m.Accepted))
	for _, a := range m.Accepted {
		b.accepted[a.Tap.Ifindex] = candidate{TapRef: a.Tap, firstSeen: a.FirstSeen, passes: 2}
	}
	saved := b.memory()
	b.saved = &saved
	r.publishBrake()
	if b.view.Engaged {
		r.log.Warn("mass-removal brake engaged before the restart: it still holds", "since", b.view.Since, "reason", b.view.Reason,
			"releases_at", b.view.ReleasesAt, "release", "galactic-node pass --allow-mass-removal")
	}
}

// EngageBrake engages the brake for why, with no pass behind it: the
// daemon does so when the brake's memory could not be read, since it
// cannot tell whether the brake held before it started.
func (r *Reclaimer) EngageBrake(why string) {
	r.passMu.Lock()
	defer r.passMu.Unlock()
	now := time.Now()
	b := &r.brake
	b.view = Brake{Engaged: true, Since: now, Reason: why, LastRelease: b.view.LastRelease, LastReleaseAt: b.view.LastReleaseAt}
	b.lowest, b.lowestAt = 0, now
	if r.cfg.BrakeReleaseAfter > 0 {
		b.view.ReleasesAt = now.Add(r.cfg.BrakeReleaseAfter)
	}
	r.publishBrake()
	r.saveBrake()
	r.log.Warn("mass-removal brake engaged: passes remove nothing until it is released", "reason", why,
		"releases_at", b.view.ReleasesAt, "release", "galactic-node pass --allow-mass-removal")
	if r.events != nil {
		r.events.BrakeEngaged(b.view)
	}
}

// saveBrake writes the brake's memory to the store if it changed since
// the last write.
func (r *Reclaimer) saveBrake() {
	if r.cfg.Memory == nil {
		return
	}
	m := r.brake.memory()
	if r.brake.saved != nil && reflect.DeepEqual(*r.brake.saved, m) {
		return
	}
	if err := r.cfg.Memory.Save(m); err != nil {
		r.log.Error("the brake's memory could not be saved: a restart now would forget it", "error", err)
		r.mu.Lock()
		r.brakeSaveErr = err.Error()
		r.mu.Unlock()
		return
	}
	r.brake.saved = &m
	r.mu.Lock()
	r.brakeSaveErr = ""
	r.mu.Unlock()
}

// Brake returns the brake's state.
func (r *Reclaimer) Brake() Brake {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.brakeView
	b.MemoryError = r.brakeSaveErr
	return b
}

// publishBrake copies the brake's state for views.
func (r *Reclaimer) publishBrake() {
	r.mu.Lock()
	r.brakeView = r.brake.view
	r.mu.Unlock()
}
