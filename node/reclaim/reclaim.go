// Package reclaim removes tenant taps that outlived their VPCAttachment: a
// stamped tap that nothing holds and whose (VPC, attachment) identity no
// VPCAttachment and no BGPAdvertisement carries, seen so by two consecutive
// passes with the same ifindex, name and owner stamp. Each completed pass
// also clears the eBPF rows and TCX pins of interfaces deleted behind the
// node's back, once two passes found their ifindex without a link.
//
// Every rule errs on the side of keeping a tap. A pass removes nothing unless
// the inventory is healthy; a candidate is removed only by the pass after the
// one that found it; a pass that would remove a mass of taps at once removes
// none until released (the brake, brake.go); before any lock is taken, an
// inventory that caches the API server is proven current by a consistent
// read of it, and one that keeps no copy of it (an inventory.Asker) is
// asked, consistently, about the pass's unheld taps only, after the links
// were read, which makes the ask the proof; just before removal, under the
// tap's VRF lock, the link is read again and the identity checked against a
// fresh snapshot and that proof. Its
// eBPF rows go through attachreg, as CNI DEL's do, and the kernel takes its
// routes.
//
// The package knows nothing of Kubernetes or HTTP: it takes the link layer,
// the inventory, the registry and the lock as interfaces.
package reclaim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/teardown"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
)

// Links is what a pass needs of the link layer; *link.Conn implements it.
type Links = teardown.Links

// Registry clears an interface's eBPF rows; *attachreg.Registry implements it.
type Registry = teardown.Registry

// Locker takes a VPC's VRF lock; *vrf.Locker implements it.
type Locker = teardown.Locker

// Config tunes a Reclaimer.
type Config struct {
	// DryRun makes every pass a dry run, forced or periodic: the mode to
	// roll a node out in before letting it remove anything.
	DryRun bool
	// MaxReclaimsPerPass caps removals per pass; confirmed taps beyond it
	// roll over to the next pass. 0 means DefaultMaxReclaimsPerPass, a
	// negative value no cap.
	MaxReclaimsPerPass int
	// MassRemovalShare, MassRemovalMin, InventoryShrinkShare, ShrinkWindow
	// and BrakeReleaseAfter tune the mass-removal brake (brake.go); zero
	// values take the defaults. A share of 1 or more turns its rule off; a
	// negative BrakeReleaseAfter means only an operator releases it.
	MassRemovalShare     float64
	MassRemovalMin       int
	InventoryShrinkShare float64
	ShrinkWindow         time.Duration
	BrakeReleaseAfter    time.Duration
	// LockTimeout bounds the wait for VRF locks; a tap whose lock is not
	// had in time is kept and counted as a lock failure. Default 10 s.
	LockTimeout time.Duration
	// History is how many pass reports are kept. Default 32.
	History int
	// MinCandidateAge is how long a candidate must have been seen stale
	// before a pass may confirm it, on top of the two passes: two passes
	// forced a moment apart must not take a tap whose VMM has not opened
	// it yet. 0 means no minimum.
	MinCandidateAge time.Duration
	// Prober claims each confirmed tap before its delete (holder.Prober):
	// the kernel's answer to an attach is what proves a single-queue tap
	// free. nil keeps every single-queue tap.
	Prober teardown.Prober
	// LargeInventory is the peak, in identities, from which the shrink
	// rule weighs any removal; below it, only a mass (brake.go). 0 means
	// DefaultLargeInventory, a negative value that every inventory is
	// large.
	LargeInventory int
	// Memory keeps the brake's memory across restarts; nil keeps it in
	// the daemon only. RestoreBrake gives it back at start.
	Memory BrakeMemoryStore
	// Events records removals and the brake where operators look beyond
	// the node (Kubernetes Events); nil records nothing.
	Events Recorder
}

// Recorder records what the reclaim did where operators look beyond the
// node's log, metrics and admin API: nodeevents records Kubernetes Events.
// Its methods must not block and cannot fail a pass: a removal never
// waits for a record of it. A pass makes at most one call per confirmed
// tap, so never more than the per-pass cap.
type Recorder interface {
	TapReclaimed(t TapRef, firstSeen time.Time)
	TapReclaimFailed(f Failure)
	BrakeEngaged(b Brake)
	BrakeReleased(how string, accepted int)
}

// Reclaimer runs passes, one at a time.
type Reclaimer struct {
	links Links
	inv   inventory.Source
	reg   Registry
	locks Locker
	obs   Observer
	log   *slog.Logger
	cfg   Config
	// remover is the one teardown every pass's removals and orphan
	// clearing go through, built once from the parts above.
	remover *teardown.Remover

	passMu sync.Mutex // serialises passes

	// unproven is the error of the last failed proof that the inventory
	// is current, until a proof succeeds again: meanwhile every pass tries
	// one first and, failing, removes nothing and marks nothing, so the
	// first pass after a partition heals only marks. Only passes touch it.
	unproven error

	// brake is the mass-removal brake's memory; only passes touch it.
	brake  brakeState
	events Recorder

	mu           sync.Mutex // guards what views read between passes
	brakeView    Brake
	brakeSaveErr string
	// running is the report of the pass in flight, as far as it got:
	// views list it first, with result running.
	running    *Report
	candidates map[uint32]candidate
	orphans    map[uint32]orphan
	history    []Report
	// The pass loop's heartbeat, for Stuck: Run's interval and when it
	// last went round, and when the pass in flight started (zero: none).
	loopInterval time.Duration
	loopTurned   time.Time
	passStarted  time.Time
}

// ErrStuck is returned by Stuck when the pass loop no longer goes round.
var ErrStuck = errors.New("pass loop stuck")

// candidate is a tap a pass found stale, to be confirmed by a later one.
type candidate struct {
	teardown.TapRef
	firstSeen time.Time
	passes    int
}

// eligibleAt is when a pass may confirm c.
func (r *Reclaimer) eligibleAt(c candidate) time.Time { return c.firstSeen.Add(r.cfg.MinCandidateAge) }

// New returns a Reclaimer. obs may be nil (nothing observed), log may be nil.
func New(links Links, inv inventory.Source, reg Registry, locks Locker, obs Observer, log *slog.Logger, cfg Config) *Reclaimer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.LockTimeout <= 0 {
		cfg.LockTimeout = 10 * time.Second
	}
	if cfg.History <= 0 {
		cfg.History = 32
	}
	switch {
	case cfg.MaxReclaimsPerPass == 0:
		cfg.MaxReclaimsPerPass = DefaultMaxReclaimsPerPass
	case cfg.MaxReclaimsPerPass < 0:
		cfg.MaxReclaimsPerPass = 0
	}
	if cfg.MassRemovalShare <= 0 {
		cfg.MassRemovalShare = DefaultMassRemovalShare
	}
	if cfg.MassRemovalMin <= 0 {
		cfg.MassRemovalMin = DefaultMassRemovalMin
	}
	switch {
	case cfg.LargeInventory == 0:
		cfg.LargeInventory = DefaultLargeInventory
	case cfg.LargeInventory < 0:
		cfg.LargeInventory = 0
	}
	if cfg.InventoryShrinkShare <= 0 {
		cfg.InventoryShrinkShare = DefaultInventoryShrinkShare
	}
	if cfg.ShrinkWindow <= 0 {
		cfg.ShrinkWindow = DefaultShrinkWindow
	}
	switch {
	case cfg.BrakeReleaseAfter == 0:
		cfg.BrakeReleaseAfter = DefaultBrakeReleaseAfter
	case cfg.BrakeReleaseAfter < 0:
		cfg.BrakeReleaseAfter = 0
	}
	remover := &teardown.Remover{Links: links, Registry: reg, Locks: locks, Prober: cfg.Prober, LockTimeout: cfg.LockTimeout, Log: log}
	return &Reclaimer{links: links, inv: inv, reg: reg, locks: locks, obs: obs, log: log, cfg: cfg, remover: remover, events: cfg.Events}
}

// Run runs a pass every interval until ctx ends; interval 0 means passes
// only run when Pass is called. A pass in flight when ctx ends is finished
// (Pass ignores cancellation), so no tap is left half-removed.
func (r *Reclaimer) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r.mu.Lock()
		r.loopInterval, r.loopTurned = interval, time.Now()
		r.mu.Unlock()
		r.Pass(ctx, PassOptions{})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Stuck returns an error wrapping ErrStuck when the pass loop no longer
// goes round at now: a pass has been in flight for longer than after (a
// netlink read or an API server call that never returns), or Run has not
// started a pass for its interval plus after. A pass skipped because the
// inventory is unhealthy still goes round: a restart would not help it.
func (r *Reclaimer) Stuck(now time.Time, after time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.passStarted.IsZero() && now.Sub(r.passStarted) > after {
		return fmt.Errorf("%w: a pass has been in flight for %s", ErrStuck, now.Sub(r.passStarted).Round(time.Second))
	}
	if r.loopInterval > 0 && now.Sub(r.loopTurned) > r.loopInterval+after {
		return fmt.Errorf("%w: no pass started for %s (interval %s)", ErrStuck, now.Sub(r.loopTurned).Round(time.Second), r.loopInterval)
	}
	return nil
}

// Schedule says when passes run.
type Schedule struct {
	DryRun   bool
	Interval time.Duration // 0: passes run only when forced
	// NextDue is when Run starts its next pass; zero when passes run only
	// when forced, or before Run has started.
	NextDue time.Time
}

// scheduleJSON is Schedule on the wire: the interval as text ("1m0s"), as a
// person and a flag write it.
type scheduleJSON struct {
	DryRun   bool      `json:"dryRun"`
	Interval string    `json:"interval"`
	NextDue  time.Time `json:"nextDue,omitzero"`
}

func (s Schedule) MarshalJSON() ([]byte, error) {
	return json.Marshal(scheduleJSON{s.DryRun, s.Interval.String(), s.NextDue})
}

func (s *Schedule) UnmarshalJSON(b []byte) error {
	var j scheduleJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	d, err := time.ParseDuration(j.Interval)
	if err != nil {
		return fmt.Errorf("schedule interval: %w", err)
	}
	*s = Schedule{DryRun: j.DryRun, Interval: d, NextDue: j.NextDue}
	return nil
}

// Schedule returns when passes run.
func (r *Reclaimer) Schedule() Schedule {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Schedule{DryRun: r.cfg.DryRun, Interval: r.loopInterval}
	if r.loopInterval > 0 {
		s.NextDue = r.loopTurned.Add(r.loopInterval)
	}
	return s
}

// PassOptions modify one pass.
type PassOptions struct {
	// DryRun answers "what would a real pass do now" and does none of it:
	// it removes nothing and records nothing a later pass decides by (no
	// sighting, candidate, forgotten candidate, proof, orphan, brake state
	// or inventory size), so that previewing never brings a removal
	// closer. Its report is kept, marked Preview, and says what it did not
	// do (NotDone).
	//
	// A daemon in dry-run (Config.DryRun) is another thing: it has no real
	// pass to protect, and its passes track candidates, orphans and the
	// brake as real ones would, so that a rollout in dry-run shows what
	// the node would remove over time, pending taps included.
	DryRun bool
	// AllowMassRemoval releases the mass-removal brake, engaged or about
	// to engage: the candidates of this pass go, at the per-pass cap's
	// pace. An operator's word, after checking that the objects are gone
	// on purpose.
	AllowMassRemoval bool

	// preview is a DryRun on a daemon that removes: it records nothing.
	preview bool
}

// Pass runs one pass now, after any pass in flight, and returns its report.
// The pass keeps ctx's values but not its cancellation or deadline: a
// caller that gives up (a client hanging up, a daemon shutting down) must
// not stop a removal half-way, so every caller gets this without asking.
func (r *Reclaimer) Pass(ctx context.Context, opts PassOptions) Report {
	ctx = context.WithoutCancel(ctx)
	r.passMu.Lock()
	defer r.passMu.Unlock()
	opts.preview = opts.DryRun && !r.cfg.DryRun
	opts.DryRun = opts.DryRun || r.cfg.DryRun
	started := time.Now()
	r.mu.Lock()
	r.passStarted = started
	r.running = &Report{Started: started, DryRun: opts.DryRun, Result: ResultRunning}
	pending := len(r.candidates)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.passStarted = time.Time{}
		r.mu.Unlock()
	}()
	// A preview runs the brake's rules as a real pass would, for its
	// report, on the brake's own memory (they move the inventory's peak
	// and may engage or release it), then puts that memory back: a preview
	// that engaged the brake, or aged its peak, would change what the next
	// real pass decides.
	var brake brakeState
	if opts.preview {
		brake = r.brake.clone()
	}
	rep := r.pass(ctx, started, opts)
	rep.Finished = time.Now()
	if opts.preview {
		r.brake = brake
		rep.Preview, rep.NotDone = true, notDone(rep, pending, r.brake.view.Engaged)
	}
	if r.brake.view.Engaged && rep.Brake == nil {
		// A pass that stopped before the brake's rules (inputs not
		// trustworthy) still says that it holds.
		rep.Brake = &BrakeReport{Engaged: true, Reason: r.brake.view.Reason, Held: r.brake.view.Held}
	}
	if !opts.preview {
		r.saveBrake()
	}
	r.record(rep)
	return rep
}

// notDone says what the real pass a preview stood for would have done and
// the preview did not, from its report, the candidates pending before it,
// and whether the brake held before it.
func notDone(rep Report, pending int, braked bool) []string {
	var out []string
	if rep.Result != ResultCompleted && pending > 0 {
		out = append(out, fmt.Sprintf("%d pending not forgotten: a real pass now would forget them, and only mark in the next", pending))
	}
	if first := seenOnce(rep.Candidates, func(c CandidateReport) int { return c.Passes }); first > 0 {
		out = append(out, fmt.Sprintf("%d seen once: a real pass now would start their confirmation", first))
	}
	if n := len(rep.WouldReclaim); n > 0 {
		out = append(out, fmt.Sprintf("nothing removed: a real pass now would remove %d", n))
	}
	if b := rep.Brake; b != nil && b.Engaged && !braked {
		out = append(out, fmt.Sprintf("the brake not engaged: a real pass now would engage it, holding %d", b.Held))
	}
	if b := rep.Brake; b != nil && b.Released != "" {
		out = append(out, "the brake not released: a real pass now would release it "+b.Released)
	}
	if first := seenOnce(rep.Orphans, func(o OrphanReport) int { return o.Passes }); first > 0 {
		out = append(out, fmt.Sprintf("%d orphaned interfaces seen once: a real pass now would start their confirmation", first))
	}
	if n := len(rep.OrphansWouldClear); n > 0 {
		out = append(out, fmt.Sprintf("no orphan rows cleared: a real pass now would clear those of %d interfaces", n))
	}
	return append(out, "nothing recorded: the next real pass decides as if this dry run had not run")
}

// seenOnce counts the items that one pass has seen: those a real pass now
// would start confirming.
func seenOnce[T any](items []T, passes func(T) int) int {
	n := 0
	for _, it := range items {
		if passes(it) == 1 {
			n++
		}
	}
	return n
}

// progress updates the running pass's report, for views.
func (r *Reclaimer) progress(update func(*Report)) {
	r.mu.Lock()
	if r.running != nil {
		update(r.running)
	}
	r.mu.Unlock()
}

func (r *Reclaimer) pass(ctx context.Context, started time.Time, opts PassOptions) Report {
	rep := Report{Started: started, DryRun: opts.DryRun}

	links, err := r.links.Links(ctx)
	if err != nil {
		rep.Result, rep.Reason = ResultFailed, fmt.Sprintf("read links: %v", err)
		r.forget(opts)
		return rep
	}
	rep.Inputs.Links = len(links)
	var stamped []link.Tap
	for _, t := range link.TenantTaps(links) {
		rep.Inputs.TenantTaps++
		if t.Stamped() {
			stamped = append(stamped, t)
		}
	}
	rep.Inputs.StampedTaps = len(stamped)

	snap := r.inv.Snapshot(ctx)
	// An inventory that keeps no copy of the cluster is asked about the
	// unheld taps only, now, after the links were read: its answer is a
	// consistent read, the proof the removal rests on. A pass with no
	// unheld tap asks nothing.
	var asked *inventory.Snapshot
	if a, ok := r.inv.(inventory.Asker); ok {
		if ids := unheldIdentities(stamped); len(ids) > 0 {
			s, err := a.Ask(ctx, ids)
			if err != nil {
				return r.skip(rep, opts, "nothing removed and every candidate forgotten: "+err.Error())
			}
			snap, asked = s, &s
		}
	}
	rep.Inputs.Identities, rep.Inputs.Attachments, rep.Inputs.Advertisements = snap.Identities(), snap.Attachments, snap.Advertisements
	// A count and a capped sample: the report is kept and served.
	malformed := malformedInputs(&rep.Inputs, &snap)
	if r.obs != nil {
		r.obs.Malformed(malformed)
	}
	if err := snap.Healthy(); err != nil {
		return r.skip(rep, opts, "inventory not trustworthy, nothing removed and every candidate forgotten: "+err.Error())
	}

	if err := r.reprove(ctx, opts); err != nil {
		return r.skip(rep, opts, "nothing removed and every candidate forgotten: "+err.Error())
	}

	now := time.Now()
	r.mu.Lock()
	prev := r.candidates
	r.mu.Unlock()
	next := make(map[uint32]candidate)
	var confirmed []candidate
	// The taps the cache says are carried: the proof the brake may read
	// can show some of them stale.
	var carried []link.Tap
	for _, t := range stamped {
		if snap.Carried(t.Identity) {
			carried = append(carried, t)
			continue
		}
		// Marking reads the kernel's attributes only; a single-queue tap
		// with carrier off is probed, by attaching, only once confirmed.
		if held, _ := holder.Held(t); held {
			continue
		}
		c := candidate{TapRef: teardown.RefOf(t), firstSeen: now, passes: 1}
		if p, ok := prev[t.Index]; ok && p.Expect() == c.Expect() {
			c.firstSeen, c.passes = p.firstSeen, p.passes+1
			if !now.Before(r.eligibleAt(c)) {
				confirmed = append(confirmed, c)
			}
		}
		next[t.Index] = c
		why := "nothing holds it and no VPCAttachment or BGPAdvertisement carries " + t.Identity.String()
		if !t.Tun.MultiQueue {
			why = "single-queue with carrier off (an attach probe proves it free before removal) and no VPCAttachment or BGPAdvertisement carries " + t.Identity.String()
		}
		rep.Candidates = append(rep.Candidates, CandidateReport{
			Tap: c.TapRef, FirstSeen: c.firstSeen, EligibleAt: r.eligibleAt(c), Passes: c.passes, Why: why,
		})
	}
	for _, c := range rep.Candidates {
		if c.Passes == 1 {
			r.log.Info("stale tap candidate", "tap", c.Tap.Name, "ifindex", c.Tap.Ifindex, "owner", c.Tap.Owner, "why", c.Why)
		}
	}
	proof, staleByProof, err := r.proveForBrake(ctx, confirmed, carried)
	if err != nil {
		if !opts.preview {
			r.unproven = err
		}
		return r.skip(rep, opts, "nothing removed and every candidate forgotten: "+err.Error())
	}
	if proof == nil {
		proof = asked
	}
	peak := r.observeSize(now, snap.Identities())
	brake := r.applyBrake(now, confirmed, next, staleByProof, len(stamped), peak, snap.Identities(), opts)
	if !opts.preview {
		r.publishBrake()
	}
	if brake.Engaged || brake.Released != "" {
		rep.Brake = &brake
	}
	if brake.Engaged {
		// The candidates stay tracked, so that a release removes them in
		// its own pass; the orphan collection is no tenant's business.
		rep.Reason = "mass-removal brake engaged, nothing removed: " + brake.Reason
		// The held taps are confirmed all the same: a braked report
		// lists the taps that would have gone, and Held says the brake
		// kept them.
		slices.SortFunc(confirmed, func(a, b candidate) int { return cmp.Compare(a.Ifindex, b.Ifindex) })
		for _, c := range confirmed {
			rep.Confirmed = append(rep.Confirmed, c.TapRef)
		}
		rep.Held = slices.Clone(rep.Confirmed)
		r.track(next, opts)
		r.collectOrphans(ctx, links, opts.DryRun, !opts.preview, &rep)
		rep.Result = ResultCompleted
		return rep
	}
	slices.SortFunc(confirmed, func(a, b candidate) int { return cmp.Compare(a.Ifindex, b.Ifindex) })
	if max := r.cfg.MaxReclaimsPerPass; max > 0 && len(confirmed) > max {
		rep.RolledOver = len(confirmed) - max
		confirmed = confirmed[:max]
	}
	for _, c := range confirmed {
		rep.Confirmed = append(rep.Confirmed, c.TapRef)
		r.log.Info("stale tap confirmed", "tap", c.Name, "ifindex", c.Ifindex, "owner", c.Owner, "passes", c.passes)
	}
	r.progress(func(run *Report) {
		run.Inputs, run.Candidates, run.Confirmed, run.RolledOver = rep.Inputs, slices.Clone(rep.Candidates), slices.Clone(rep.Confirmed), rep.RolledOver
	})
	if len(confirmed) > 0 {
		if err := r.remove(ctx, confirmed, links, opts.DryRun, proof, &rep); err != nil {
			if !opts.preview {
				r.unproven = err
			}
			return r.skip(rep, opts, "nothing removed and every candidate forgotten: "+err.Error())
		}
	}
	for _, t := range rep.Reclaimed {
		delete(next, t.Ifindex)
	}
	// A tap the removal kept was found live a moment ago (held at the
	// probe, its identity carried at the recheck) or in someone's hands
	// (its VRF lock taken, its link changed): it starts over, two
	// sightings and the minimum age from now, rather than go on the next
	// pass on an age counted from before it lived.
	for _, k := range rep.Kept {
		delete(next, k.Tap.Ifindex)
	}
	r.track(next, opts)
	r.collectOrphans(ctx, links, opts.DryRun, !opts.preview, &rep)
	rep.Result = ResultCompleted
	return rep
}

// reprove, after a failed proof, proves the inventory current again before
// the pass may even mark: what a partitioned node's cache says is not a
// sighting. It makes no request while no proof has failed.
func (r *Reclaimer) reprove(ctx context.Context, opts PassOptions) error {
	p, ok := r.inv.(inventory.Prover)
	if r.unproven == nil || !ok {
		return nil
	}
	if _, err := r.prove(ctx, p); err != nil {
		return fmt.Errorf("inventory still not proven current (first failure: %w): %w", r.unproven, err)
	}
	if opts.preview {
		// The next real pass proves it again for itself: the proof is
		// what lets a pass mark after a partition.
		return nil
	}
	r.log.Info("inventory proven current again", "after", r.unproven)
	r.unproven = nil
	return nil
}

// prove reads the API server consistently and returns what it holds if
// that is healthy. The Prover bounds each request it makes, so that the
// read's bound grows with what there is to read.
func (r *Reclaimer) prove(ctx context.Context, p inventory.Prover) (inventory.Snapshot, error) {
	proof, err := p.Prove(ctx)
	if err == nil {
		err = proof.Healthy()
	}
	return proof, err
}

// skip ends a pass that removes nothing because its inputs cannot be
// trusted: it forgets every candidate, so that the next healthy pass only
// marks, and says why.
func (r *Reclaimer) skip(rep Report, opts PassOptions, why string) Report {
	rep.Result, rep.Reason = ResultSkipped, why
	r.log.Warn("reclaim pass removed nothing", "reason", why)
	r.forget(opts)
	return rep
}

// unheldIdentities returns the identities of the taps nothing holds, as
// far as the kernel's attributes tell: those a pass must ask about. A
// single-queue tap with carrier off counts as unheld; its probe comes later.
func unheldIdentities(taps []link.Tap) []identity.Identity {
	var ids []identity.Identity
	for _, t := range taps {
		if held, _ := holder.Held(t); !held {
			ids = append(ids, t.Identity)
		}
	}
	return ids
}

// proveForBrake reads the API server consistently before the brake weighs a
// pass that has taps to remove, when the inventory caches it and the brake
// does not hold already: a cache that lags sees a mass deletion arrive in
// parts, and would let the brake weigh each part alone. It returns the
// proof, for the removal to rest on (one read a pass), and how many unheld
// taps the cache calls carried and the proof shows stale. A nil proof means
// none was needed; the removal proves for itself if it comes to run.
func (r *Reclaimer) proveForBrake(ctx context.Context, confirmed []candidate, carried []link.Tap) (*inventory.Snapshot, int, error) {
	p, ok := r.inv.(inventory.Prover)
	if !ok || len(confirmed) == 0 || r.brake.view.Engaged {
		return nil, 0, nil
	}
	proof, err := r.prove(ctx, p)
	if err != nil {
		return nil, 0, err
	}
	stale := 0
	for _, t := range carried {
		if held, _ := holder.Held(t); !held && !proof.Carried(t.Identity) {
			stale++
		}
	}
	return &proof, stale, nil
}

// forget drops every candidate: the next healthy pass only marks. A
// preview forgets nothing (PassOptions.DryRun); its report says a real
// pass would have.
func (r *Reclaimer) forget(opts PassOptions) {
	r.track(nil, opts)
}

// track makes next the candidates the next pass confirms against, unless
// this is a preview: its sightings must not count towards a removal.
func (r *Reclaimer) track(next map[uint32]candidate, opts PassOptions) {
	if opts.preview {
		return
	}
	r.mu.Lock()
	r.candidates = next
	r.mu.Unlock()
}

func (r *Reclaimer) record(rep Report) {
	r.mu.Lock()
	r.running = nil
	r.history = append(r.history, rep)
	if len(r.history) > r.cfg.History {
		r.history = slices.Delete(r.history, 0, len(r.history)-r.cfg.History)
	}
	pending := len(r.candidates)
	r.mu.Unlock()
	if r.obs != nil {
		r.obs.PassDone(rep, pending)
	}
}

// remove hands the confirmed taps to the teardown. For an inventory that
// caches the API server it rests on a consistent read of the API server,
// proof if the pass made one for the brake, or one of its own: a cache
// can be behind (a partition, a dead API server, a re-created object), and
// only the API server's own answer may justify a removal. That read comes
// before any VRF lock is taken, since it lasts as long as the API server is
// slow and CNI ADD in the same VPC waits for the lock; under the locks, the
// taps are rechecked against that proof and a fresh snapshot of the cache,
// which makes no request. It returns the error that kept every tap when the
// inventory could not be proven current.
func (r *Reclaimer) remove(ctx context.Context, confirmed []candidate, dump []link.Link, dryRun bool, proof *inventory.Snapshot, rep *Report) error {
	targets := make([]teardown.TapRef, len(confirmed))
	for i, c := range confirmed {
		targets[i] = c.TapRef
	}
	recheck := &inventoryRecheck{r: r, proof: proof}
	if p, ok := r.inv.(inventory.Prover); ok && proof == nil {
		proof, err := r.prove(ctx, p)
		if err != nil {
			return err
		}
		recheck.proof = &proof
	}
	firstSeen := make(map[uint32]time.Time, len(confirmed))
	for _, c := range confirmed {
		firstSeen[c.Ifindex] = c.firstSeen
	}
	// Each removal shows in the running pass as it happens, so that a
	// tap gone is never a tap no report names.
	progress := func(out teardown.Outcome) {
		r.progress(func(run *Report) {
			run.Reclaimed, run.WouldReclaim = slices.Clone(out.Removed), slices.Clone(out.WouldRemove)
			run.Removing = slices.Clone(out.Removing)
			run.Kept, run.Failed = slices.Clone(out.Kept), slices.Clone(out.Failed)
		})
	}
	out := r.remover.Remove(ctx, targets, teardown.Options{DryRun: dryRun, Dump: dump, Recheck: recheck, Progress: progress})
	rep.Reclaimed, rep.WouldReclaim, rep.Kept, rep.Failed = out.Removed, out.WouldRemove, out.Kept, out.Failed
	for _, t := range out.Removed {
		r.log.Info("stale tap reclaimed", "tap", t.Name, "ifindex", t.Ifindex, "owner", t.Owner,
			"identity", t.Identity.String(), "first_seen", firstSeen[t.Ifindex])
	}
	if r.events != nil {
		for _, t := range out.Removed {
			r.events.TapReclaimed(t, firstSeen[t.Ifindex])
		}
		for _, f := range out.Failed {
			r.events.TapReclaimFailed(f)
		}
	}
	return nil
}

// inventoryRecheck is a pass's last word on its confirmed taps, asked under
// the VRF locks after the links were read again: a fresh snapshot of the
// inventory and, for one that reads the API server, the consistent read
// made before the locks were taken (the proof, or the ask). An Asker's
// fresh snapshot carries nothing: it says only that its reads still
// succeed. It makes no request: a lock is
// held while it runs.
type inventoryRecheck struct {
	r     *Reclaimer
	proof *inventory.Snapshot
	snaps []*inventory.Snapshot
}

func (c *inventoryRecheck) Recheck(ctx context.Context) error {
	// Taken after the links were read again, so an attachment that
	// appeared while they were being read, or since the proof, is seen.
	fresh := c.r.inv.Snapshot(ctx)
	if err := fresh.Healthy(); err != nil {
		return fmt.Errorf("fresh inventory not trustworthy: %w", err)
	}
	c.snaps = []*inventory.Snapshot{&fresh}
	if c.proof != nil {
		c.snaps = append(c.snaps, c.proof)
	}
	return nil
}

func (c *inventoryRecheck) KeepWhy(t teardown.TapRef) string {
	for _, s := range c.snaps {
		if s.Carried(t.Identity) {
			named, total := inventory.Named(s.Carriers(t.Identity))
			if more := total - len(named); more > 0 {
				return fmt.Sprintf("identity %s carried by %v and %d more at recheck", t.Identity, named, more)
			}
			return fmt.Sprintf("identity %s carried by %v at recheck", t.Identity, named)
		}
	}
	return ""
}
