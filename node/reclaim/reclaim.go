// Package reclaim removes tenant taps that outlived their VPCAttachment: a
// stamped tap that nothing holds and whose (VPC, attachment) identity no
// VPCAttachment and no BGPAdvertisement carries, seen so by two consecutive
// passes with the same ifindex, name and owner stamp.
//
// Every rule errs on the side of keeping a tap. A pass removes nothing unless
// the inventory is healthy; a candidate is removed only by the pass after the
// one that found it; just before removal, under the tap's VRF lock, the link
// is read again and the identity checked against a fresh snapshot. Its eBPF
// rows go through attachreg, as CNI DEL's do, and the kernel takes its routes.
//
// The package knows nothing of Kubernetes or HTTP: it takes the link layer,
// the inventory, the registry and the lock as interfaces.
package reclaim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/link"
)

// Links is what a pass needs of the link layer; *link.Conn implements it.
type Links interface {
	Links(ctx context.Context) ([]link.Link, error)
	Verify(ctx context.Context, want link.Expect) (link.Link, error)
	Set(ctx context.Context, index uint32, ch link.Change) error
	DeleteGroup(ctx context.Context, group uint32) error
}

// Registry clears an interface's eBPF rows; *attachreg.Registry implements it.
type Registry interface {
	UnregisterInterface(ctx context.Context, ifindex uint32) error
}

// Locker takes a VPC's VRF lock; *vrf.Locker implements it.
type Locker interface {
	Lock(ctx context.Context, vpc identity.VPC) (unlock func(), err error)
}

// Config tunes a Reclaimer.
type Config struct {
	// DryRun makes every pass a dry run, forced or periodic: the mode to
	// roll a node out in before letting it remove anything.
	DryRun bool
	// MaxReclaimsPerPass caps removals per pass; confirmed taps beyond it
	// roll over to the next pass. 0 means no cap.
	MaxReclaimsPerPass int
	// LockTimeout bounds the wait for VRF locks; a tap whose lock is not
	// had in time is kept and counted as a lock failure. Default 10 s.
	LockTimeout time.Duration
	// History is how many pass reports are kept. Default 32.
	History int
}

// Reclaimer runs passes, one at a time.
type Reclaimer struct {
	links   Links
	inv     inventory.Source
	reg     Registry
	locks   Locker
	metrics *Metrics
	log     *slog.Logger
	cfg     Config

	passMu sync.Mutex // serialises passes

	mu         sync.Mutex // guards what views read between passes
	candidates map[uint32]candidate
	history    []Report
}

// candidate is a tap a pass found stale, to be confirmed by the next.
type candidate struct {
	expect    link.Expect
	identity  identity.Identity
	firstSeen time.Time
	passes    int
}

// New returns a Reclaimer. metrics may be nil (no metrics), log may be nil.
func New(links Links, inv inventory.Source, reg Registry, locks Locker, metrics *Metrics, log *slog.Logger, cfg Config) *Reclaimer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.LockTimeout <= 0 {
		cfg.LockTimeout = 10 * time.Second
	}
	if cfg.History <= 0 {
		cfg.History = 32
	}
	return &Reclaimer{links: links, inv: inv, reg: reg, locks: locks, metrics: metrics, log: log, cfg: cfg}
}

// Run runs a pass every interval until ctx ends; interval 0 means passes
// only run when Pass is called. A pass in flight when ctx ends is finished
// under its own deadline-free context, so no tap is left half-removed.
func (r *Reclaimer) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r.Pass(context.WithoutCancel(ctx), PassOptions{})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// PassOptions modify one pass.
type PassOptions struct {
	// DryRun computes and reports, removing nothing. Candidates are still
	// tracked, so a dry run shows what the next real pass would confirm.
	DryRun bool
}

// Pass runs one pass now, after any pass in flight, and returns its report.
func (r *Reclaimer) Pass(ctx context.Context, opts PassOptions) Report {
	r.passMu.Lock()
	defer r.passMu.Unlock()
	opts.DryRun = opts.DryRun || r.cfg.DryRun
	rep := r.pass(ctx, opts)
	rep.Finished = time.Now()
	r.record(rep)
	return rep
}

func (r *Reclaimer) pass(ctx context.Context, opts PassOptions) Report {
	rep := Report{Started: time.Now(), DryRun: opts.DryRun}

	links, err := r.links.Links(ctx)
	if err != nil {
		rep.Result, rep.Reason = ResultFailed, fmt.Sprintf("read links: %v", err)
		r.forget()
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
	rep.Inputs.Identities, rep.Inputs.Attachments, rep.Inputs.Advertisements = snap.Identities(), snap.Attachments, snap.Advertisements
	for _, m := range snap.Malformed {
		rep.Inputs.Malformed = append(rep.Inputs.Malformed, m.String())
	}
	if err := snap.Healthy(); err != nil {
		rep.Result, rep.Reason = ResultSkipped, "inventory not trustworthy, nothing removed and every candidate forgotten: "+err.Error()
		r.log.Warn("reclaim pass removed nothing", "reason", rep.Reason)
		r.forget()
		return rep
	}

	now := time.Now()
	r.mu.Lock()
	prev := r.candidates
	r.mu.Unlock()
	next := make(map[uint32]candidate)
	var confirmed []candidate
	for _, t := range stamped {
		if t.Held() || snap.Carried(t.Identity) {
			continue
		}
		c := candidate{expect: link.Expect{Index: t.Index, Name: t.Name, Alias: t.Alias}, identity: t.Identity, firstSeen: now, passes: 1}
		if p, ok := prev[t.Index]; ok && p.expect == c.expect {
			c.firstSeen, c.passes = p.firstSeen, p.passes+1
			confirmed = append(confirmed, c)
		}
		next[t.Index] = c
		rep.Candidates = append(rep.Candidates, CandidateReport{
			Tap: tapRef(c), FirstSeen: c.firstSeen, Passes: c.passes,
			Why: "nothing holds it and no VPCAttachment or BGPAdvertisement carries " + t.Identity.String(),
		})
	}
	for _, c := range rep.Candidates {
		if c.Passes == 1 {
			r.log.Info("stale tap candidate", "tap", c.Tap.Name, "ifindex", c.Tap.Ifindex, "owner", c.Tap.Owner, "why", c.Why)
		}
	}
	slices.SortFunc(confirmed, func(a, b candidate) int { return cmp.Compare(a.expect.Index, b.expect.Index) })
	if max := r.cfg.MaxReclaimsPerPass; max > 0 && len(confirmed) > max {
		rep.RolledOver = len(confirmed) - max
		confirmed = confirmed[:max]
	}
	for _, c := range confirmed {
		rep.Confirmed = append(rep.Confirmed, tapRef(c))
		r.log.Info("stale tap confirmed", "tap", c.expect.Name, "ifindex", c.expect.Index, "owner", c.expect.Alias, "passes", c.passes)
	}
	if len(confirmed) > 0 {
		r.remove(ctx, confirmed, links, opts.DryRun, &rep)
	}
	for _, t := range rep.Reclaimed {
		delete(next, t.Ifindex)
	}
	r.mu.Lock()
	r.candidates = next
	r.mu.Unlock()
	rep.Result = ResultCompleted
	return rep
}

// forget drops every candidate: the next healthy pass only marks.
func (r *Reclaimer) forget() {
	r.mu.Lock()
	r.candidates = nil
	r.mu.Unlock()
}

func (r *Reclaimer) record(rep Report) {
	r.mu.Lock()
	r.history = append(r.history, rep)
	if len(r.history) > r.cfg.History {
		r.history = slices.Delete(r.history, 0, len(r.history)-r.cfg.History)
	}
	pending := len(r.candidates)
	r.mu.Unlock()
	if r.metrics == nil {
		return
	}
	m := r.metrics
	m.pending.Set(float64(pending))
	m.reclaimed.Add(float64(len(rep.Reclaimed)))
	for _, f := range rep.Failed {
		m.failures.WithLabelValues(f.Stage).Inc()
	}
	m.passes.WithLabelValues(rep.Result).Inc()
	m.passDuration.Observe(rep.Finished.Sub(rep.Started).Seconds())
	if rep.Result == ResultCompleted {
		m.lastPass.Set(float64(rep.Finished.UnixNano()) / 1e9)
	}
}

// remove takes the VRF locks of the confirmed taps in a fixed order,
// rechecks each, clears its rows and deletes the survivors in one batch.
func (r *Reclaimer) remove(ctx context.Context, confirmed []candidate, dump []link.Link, dryRun bool, rep *Report) {
	byVPC := map[identity.VPC][]candidate{}
	for _, c := range confirmed {
		byVPC[c.identity.VPC] = append(byVPC[c.identity.VPC], c)
	}
	vpcs := slices.Sorted(maps.Keys(byVPC))

	lockCtx, cancel := context.WithTimeout(ctx, r.cfg.LockTimeout)
	defer cancel()
	var locked []candidate
	var unlocks []func()
	defer func() {
		for i := len(unlocks) - 1; i >= 0; i-- {
			unlocks[i]()
		}
	}()
	for _, vpc := range vpcs {
		unlock, err := r.locks.Lock(lockCtx, vpc)
		if err != nil {
			for _, c := range byVPC[vpc] {
				rep.fail(r.log, c, StageLock, err)
			}
			continue
		}
		unlocks = append(unlocks, unlock)
		locked = append(locked, byVPC[vpc]...)
	}
	if len(locked) == 0 {
		return
	}

	var verified []candidate
	for _, c := range locked {
		if why, err := r.recheckLink(ctx, c); err != nil {
			rep.fail(r.log, c, StageVerify, err)
		} else if why != "" {
			rep.keep(r.log, c, why)
		} else {
			verified = append(verified, c)
		}
	}
	if len(verified) == 0 {
		return
	}
	// Taken after the links were read again, so an attachment that appeared
	// while they were being read is seen.
	fresh := r.inv.Snapshot(ctx)
	if err := fresh.Healthy(); err != nil {
		for _, c := range verified {
			rep.keep(r.log, c, "fresh inventory not trustworthy: "+err.Error())
		}
		return
	}
	var batch []candidate
	for _, c := range verified {
		if fresh.Carried(c.identity) {
			rep.keep(r.log, c, fmt.Sprintf("identity %s carried by %v at recheck", c.identity, fresh.Carriers(c.identity)))
			continue
		}
		if dryRun {
			rep.WouldReclaim = append(rep.WouldReclaim, tapRef(c))
			continue
		}
		if err := r.reg.UnregisterInterface(ctx, c.expect.Index); err != nil {
			rep.fail(r.log, c, StageRows, err)
			continue
		}
		batch = append(batch, c)
	}
	if len(batch) > 0 {
		r.deleteBatch(ctx, batch, dump, rep)
	}
}

// recheckLink reads the link again: it returns why the tap must be kept, or
// an error when the read itself failed.
func (r *Reclaimer) recheckLink(ctx context.Context, c candidate) (string, error) {
	l, err := r.links.Verify(ctx, c.expect)
	switch {
	case errors.Is(err, link.ErrLinkGone):
		return "gone before removal", nil
	case errors.Is(err, link.ErrLinkChanged):
		return err.Error(), nil
	case err != nil:
		return "", err
	}
	t, ok := l.AsTap()
	if !ok {
		return "no longer reads as a tenant tap", nil
	}
	if t.Held() {
		return "held at recheck", nil
	}
	return "", nil
}

// deleteBatch moves the verified taps into a link group reserved for this
// batch, checks that the group holds exactly them, none held, and deletes the
// group in one request: the kernel then unregisters them in one batch.
func (r *Reclaimer) deleteBatch(ctx context.Context, batch []candidate, dump []link.Link, rep *Report) {
	group := reserveGroup(dump)
	var grouped []candidate
	for _, c := range batch {
		if err := r.links.Set(ctx, c.expect.Index, link.Change{Group: &group}); err != nil {
			rep.fail(r.log, c, StageLink, fmt.Errorf("move to link group %#x: %w", group, err))
			continue
		}
		grouped = append(grouped, c)
	}
	if len(grouped) == 0 {
		return
	}
	ungroup := func(cs []candidate) {
		zero := uint32(0)
		for _, c := range cs {
			_ = r.links.Set(context.WithoutCancel(ctx), c.expect.Index, link.Change{Group: &zero})
		}
	}
	links, err := r.links.Links(ctx)
	if err != nil {
		ungroup(grouped)
		for _, c := range grouped {
			rep.fail(r.log, c, StageLink, fmt.Errorf("read link group %#x before delete: %w", group, err))
		}
		return
	}
	ours := make(map[uint32]candidate, len(grouped))
	for _, c := range grouped {
		ours[c.expect.Index] = c
	}
	members := 0
	for _, l := range links {
		if l.Group != group {
			continue
		}
		c, ok := ours[l.Index]
		if !ok {
			// A link this pass did not verify is in the group: delete
			// nothing. It is left alone; ours are moved back.
			ungroup(grouped)
			for _, c := range grouped {
				rep.fail(r.log, c, StageLink, fmt.Errorf("link group %#x also holds %s (ifindex %d), not verified by this pass", group, l.Name, l.Index))
			}
			return
		}
		t, isTap := l.AsTap()
		if !isTap || t.Held() || l.Name != c.expect.Name || l.Alias != c.expect.Alias {
			ungroup([]candidate{c})
			delete(ours, l.Index)
			rep.keep(r.log, c, "changed or held while grouped for delete")
			continue
		}
		members++
	}
	if members == 0 {
		return
	}
	if err := r.links.DeleteGroup(ctx, group); err != nil {
		ungroup(grouped)
		for _, c := range ours {
			rep.fail(r.log, c, StageLink, err)
		}
		return
	}
	for _, c := range slices.SortedFunc(maps.Values(ours), func(a, b candidate) int { return cmp.Compare(a.expect.Index, b.expect.Index) }) {
		rep.Reclaimed = append(rep.Reclaimed, tapRef(c))
		r.log.Info("stale tap reclaimed", "tap", c.expect.Name, "ifindex", c.expect.Index, "owner", c.expect.Alias,
			"identity", c.identity.String(), "first_seen", c.firstSeen)
	}
}

// groupBase marks link groups this package reserves ('G' in the top byte);
// the low bits are random so that two passes, or two nodes' tools, never
// share one.
const groupBase = 0x47 << 24

func reserveGroup(dump []link.Link) uint32 {
	used := make(map[uint32]bool, len(dump))
	for _, l := range dump {
		used[l.Group] = true
	}
	for {
		g := uint32(groupBase | rand.IntN(1<<24-1) + 1)
		if !used[g] {
			return g
		}
	}
}
