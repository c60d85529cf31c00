// Package nodeview assembles the node's parts (links, inventory, reclaim, eBPF
// registry) into the views an operator asks for: every tenant tap with who
// holds it and who claims it, the pending candidates, pass reports, and eBPF
// rows. The admin API serves these views; this package knows nothing of HTTP.
package nodeview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/dropwatch"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
)

// ErrNotKeyedByInterface: an ifindex filter was asked of a map whose rows
// are not keyed by an interface (the counters).
var ErrNotKeyedByInterface = errors.New("map is not keyed by interface")

// Views reads the node's parts to answer the operator's questions. It
// owns none of them: the daemon makes and runs each.
type Views struct {
	Links     *link.Conn
	Inventory inventory.Source
	Reclaimer *reclaim.Reclaimer
	Registry  *attachreg.Registry
	Datapath  *datapath.Datapath
	// MaxInventoryAge is how long an inventory that caches the API server
	// (an inventory.Proven) may go unproven before Ready says so. 0: no
	// bound.
	MaxInventoryAge time.Duration
	// Holders names the processes holding each tap, for operators; no
	// removal depends on it. nil names none. Seeing every VMM's
	// descriptors needs the host PID namespace, CAP_SYS_PTRACE and
	// CAP_DAC_READ_SEARCH; Status says when a scan misses processes.
	Holders holder.Scanner
	// Drops serves the sampled records of dropped frames; nil when the
	// node has no drop monitor (DropsUnavailable says why).
	Drops            *dropwatch.Watch
	DropsUnavailable string
	// Counters are the program's node-wide frame counters; nil reports
	// none.
	Counters DropCounters
	// Records says what the CNI records' collection last did; nil when
	// the daemon collects none.
	Records RecordsSource
	// Prober asks the kernel whether a file holds a single-queue tap
	// whose carrier is off, the one kind of tap the link attributes
	// cannot judge; it should be the prober the reclaim uses, so the view
	// judges a tap as a pass would. nil asks nothing, and such taps say
	// they were not asked.
	Prober Prober

	scanMu   sync.Mutex
	lastScan holder.Scan
	scanned  time.Time
}

// Prober attaches to a tap to learn whether another file holds it;
// holder.Prober implements it.
type Prober interface {
	Claim(ctx context.Context, t link.Tap) (*holder.Claim, error)
}

// MaxProbesPerView bounds the kernel probes one Taps call makes: each
// opens the tun device and reads the link again, and a request must not
// turn into a probe of every tap on a node with thousands of candidates.
const MaxProbesPerView = 16

// MaxAskedPerView bounds the identities one Taps call asks an
// inventory.Asker about: each costs the API server three small reads.
const MaxAskedPerView = 64

// scanMaxAge is how long Status and the metrics reuse a holder scan: a
// scrape or status flood must not turn into a /proc walk each.
const scanMaxAge = 30 * time.Second

// scan returns a scan of the host's processes no older than maxAge, and
// when it was made (zero: none was).
func (v *Views) scan(ctx context.Context, maxAge time.Duration) (holder.Scan, time.Time) {
	if v.Holders == nil {
		return holder.NewScan(nil, "no holder scan configured"), time.Time{}
	}
	v.scanMu.Lock()
	defer v.scanMu.Unlock()
	if v.scanned.IsZero() || time.Since(v.scanned) > maxAge {
		v.lastScan, v.scanned = v.Holders.Scan(ctx), time.Now()
	}
	return v.lastScan, v.scanned
}

// TapState is what protects a tap, or how far the reclaim has got with it.
// It marshals as its string, which operators read.
type TapState string

// Tap states, from the most to the least protected.
const (
	StateHeld      TapState = "held"      // a file descriptor holds it
	StateLive      TapState = "live"      // the inventory carries its identity
	StateUnstamped TapState = "unstamped" // no owner stamp: never reclaimed
	StateCandidate TapState = "candidate" // found stale by the last pass
	StateConfirmed TapState = "confirmed" // stale on two passes: removal pending or failing
	StateStale     TapState = "stale"     // stale now, not yet seen by a pass
)

// TapView is one tenant tap as an operator sees it.
type TapView struct {
	Name    string `json:"name"`
	Ifindex uint32 `json:"ifindex"`
	// Identity is VPC and Attachment as numbers; the JSON says them once,
	// in the base62 form cluster objects carry.
	Identity   identity.Identity `json:"-"`
	VPC        string            `json:"vpc"`
	Attachment string            `json:"attachment"`
	Owner      string            `json:"owner"`
	Master     string            `json:"master"`
	MasterKind string            `json:"masterKind"`
	Held       bool              `json:"held"`
	HeldWhy    string            `json:"heldWhy,omitempty"`
	Holders    []holder.Holder   `json:"holders,omitempty"`
	// CarriedBy names at most inventory.MaxNamed of the objects that carry
	// the identity; Carriers counts them all.
	CarriedBy []inventory.ObjectRef `json:"carriedBy"`
	Carriers  int                   `json:"carriers"`
	// CarriersUnknown says why CarriedBy is not known: an inventory that
	// keeps no copy of the cluster (--inventory=candidates) is asked, and
	// the ask failed or the tap was beyond MaxAskedPerView.
	CarriersUnknown string   `json:"carriersUnknown,omitempty"`
	State           TapState `json:"state"`
	// Program is what the tap's pinned link runs; nil when none is
	// attached.
	Program *attachreg.Program `json:"program,omitempty"`
	// Decisions counts the frames the program judged for the tap's
	// identity, by decision (every decision named, zeros included): the
	// counters are the identity's, shared by every interface registered
	// with it, and start from zero when the identity is registered anew.
	// nil when the counters could not be read (DecisionsError says why).
	Decisions      map[datapath.Decision]uint64 `json:"decisions"`
	DecisionsError string                       `json:"decisionsError,omitempty"`
	// Unbound: the tap was taken over from an older build without its
	// MAC and addresses (no record of its ADD said them), so anti-spoofing
	// is off for it until an ADD registers it.
	Unbound bool `json:"unbound"`
}

// Dropped is how many of the tap's frames the program dropped: denied,
// malformed or spoofed.
func (v TapView) Dropped() uint64 {
	return v.Decisions[datapath.DecisionDeny] + v.Decisions[datapath.DecisionMalformed] + v.Decisions[datapath.DecisionSpoofed]
}

// decisionCounts reads every identity's decision counters in one dump:
// one syscall walk of the rows that exist, not one lookup per tap and
// decision.
func (v *Views) decisionCounts() (map[identity.Identity]map[datapath.Decision]uint64, error) {
	if v.Datapath == nil {
		return nil, errors.New("no datapath opened")
	}
	rows, err := v.Datapath.Decisions.Dump(0)
	if err != nil {
		return nil, fmt.Errorf("read decision counters: %w", err)
	}
	out := make(map[identity.Identity]map[datapath.Decision]uint64)
	for _, r := range rows {
		id := attachreg.IdentityOf(r.Key.VPC, r.Key.Attachment)
		if out[id] == nil {
			out[id] = map[datapath.Decision]uint64{}
		}
		out[id][r.Key.Decision] += r.Value
	}
	return out, nil
}

// Taps returns every tenant tap.
func (v *Views) Taps(ctx context.Context) ([]TapView, error) {
	links, err := v.Links.Links(ctx)
	if err != nil {
		return nil, fmt.Errorf("list taps: %w", err)
	}
	names := make(map[uint32]string, len(links))
	for _, l := range links {
		names[l.Index] = l.Name
	}
	snap, unknown := v.carriers(ctx, link.TenantTaps(links))
	pending := map[uint32]reclaim.Pending{}
	for _, p := range v.Reclaimer.Pending() {
		pending[p.Tap.Ifindex] = p
	}
	scan, _ := v.scan(ctx, 0)
	// A link that cannot be read shows no program; the metric and the
	// status say how many taps run another.
	var programs map[uint32]attachreg.Program
	if v.Registry != nil {
		programs, _ = v.Registry.Programs()
	}
	counts, countsErr := v.decisionCounts()
	unbound, _ := v.unboundTaps()
	views := []TapView{}
	probes := 0
	for _, t := range link.TenantTaps(links) {
		held, why := holder.Held(t)
		holders := scan.Holders(t.Name)
		if !held && len(holders) > 0 {
			// A single-queue tap whose carrier was forced off: the scan
			// saw its VMM. The reclaim would find it held at its probe.
			held, why = true, fmt.Sprintf("pid %d (%s) holds it (holder scan)", holders[0].PID, holders[0].Command)
		}
		carriedBy, carriers := inventory.Named(snap.Carriers(t.Identity))
		if !held {
			// Held calls every single-queue tap with carrier off free,
			// held or not; only an attach tells.
			held, why = v.askKernel(ctx, t, carriedBy != nil, &probes)
		}
		view := TapView{
			Name: t.Name, Ifindex: t.Index, Identity: t.Identity, VPC: t.Identity.VPC.Base62(), Attachment: t.Identity.Attachment.Base62(),
			Owner: t.Owner(), Master: names[t.Master], MasterKind: t.MasterKind, Held: held, HeldWhy: why,
			Holders: holders, CarriedBy: carriedBy, Carriers: carriers,
		}
		if view.CarriedBy == nil {
			view.CarriedBy = []inventory.ObjectRef{}
		}
		view.CarriersUnknown = unknown(t.Identity)
		var tapPending *reclaim.Pending
		if p, ok := pending[t.Index]; ok {
			tapPending = &p
		}
		view.State = tapState(t, view.Held, len(view.CarriedBy) > 0, tapPending)
		if p, ok := programs[t.Index]; ok {
			view.Program = &p
		}
		view.Unbound = unbound[t.Index]
		if countsErr != nil {
			view.DecisionsError = countsErr.Error()
		} else {
			view.Decisions = make(map[datapath.Decision]uint64, len(datapath.Decisions))
			for _, d := range datapath.Decisions {
				view.Decisions[d] = counts[t.Identity][d]
			}
		}
		views = append(views, view)
	}
	return views, nil
}

// askKernel judges t, which Held and the holder scan call free, the way a
// pass judges it before removal: by attaching to it. probes counts the
// probes of this view so far.
//
// Only a single-queue tap needs it (a multiqueue tap's queue counts count
// every file), and only a reclaim candidate gets it: a stamped tap whose
// identity no object carries, which the view would otherwise call stale,
// candidate or confirmed. A probe holds the tap's only queue while it
// runs, so a VMM opening the tap in that instant gets EBUSY; a tap the
// inventory carries belongs to a VM that may be starting now, and is never
// probed: its state reads live whatever a probe would say. For the same
// reason a probe may keep a pass's own claim out (that pass then keeps the
// tap), or find the pass's claim (the view then reads held), both on the
// side of keeping the tap.
// carriers returns the snapshot a view names the carriers of taps from, and
// why a tap's carriers are not known. An inventory that keeps no copy of
// the cluster is asked, consistently, about at most MaxAskedPerView of
// the taps' identities.
func (v *Views) carriers(ctx context.Context, taps []link.Tap) (inventory.Snapshot, func(identity.Identity) string) {
	a, ok := v.Inventory.(inventory.Asker)
	if !ok {
		return v.Inventory.Snapshot(ctx), func(identity.Identity) string { return "" }
	}
	asked := map[identity.Identity]bool{}
	var ids []identity.Identity
	for _, t := range taps {
		if !asked[t.Identity] && len(ids) < MaxAskedPerView {
			asked[t.Identity] = true
			ids = append(ids, t.Identity)
		}
	}
	snap, err := a.Ask(ctx, ids)
	return snap, func(id identity.Identity) string {
		switch {
		case err != nil:
			return "the inventory could not be asked: " + err.Error()
		case !asked[id]:
			return fmt.Sprintf("not asked: a view asks the API server about %d identities at most", MaxAskedPerView)
		}
		return ""
	}
}

func (v *Views) askKernel(ctx context.Context, t link.Tap, carried bool, probes *int) (bool, string) {
	if t.Tun == nil || t.Tun.Err() != nil || t.Tun.MultiQueue {
		return false, ""
	}
	const notAsked = "single-queue with carrier off: not asked"
	switch {
	case carried:
		return false, notAsked + " (carried by the inventory)"
	case !t.Stamped():
		return false, notAsked + " (unstamped: never reclaimed)"
	case v.Prober == nil:
		return false, notAsked + " (no kernel probe configured)"
	case *probes >= MaxProbesPerView:
		return false, fmt.Sprintf("%s: probe budget (%d per view) spent", notAsked, MaxProbesPerView)
	}
	*probes++
	c, err := v.Prober.Claim(ctx, t)
	switch {
	case errors.Is(err, holder.ErrHeld):
		return true, "the kernel refused an attach (EBUSY): a file holds its only queue"
	case err != nil:
		return false, "single-queue with carrier off: the kernel could not be asked: " + err.Error()
	}
	// Released at once: the view only asks, and a VMM may attach next.
	c.Release()
	return false, "the kernel took an attach: no file held it"
}

// tapState decides a tap's state from what protects it, the most protected
// first: a held tap reads held whatever the inventory says (removing it
// would pull it from under its process), a live one reads live even when a
// pass found it stale before (it is no longer reclaimable), and an unstamped
// one is never reclaimed, so no pass history applies to it. pending is the
// reclaim's entry at t's ifindex, or nil; it counts only when it names this
// very tap (same name and owner): the kernel reuses ifindexes, and an entry
// for a tap since replaced says nothing of the new one.
func tapState(t link.Tap, held, live bool, pending *reclaim.Pending) TapState {
	isThisTap := pending != nil && pending.Tap.Name == t.Name && pending.Tap.Owner == t.Owner()
	switch {
	case held:
		return StateHeld
	case live:
		return StateLive
	case !t.Stamped():
		return StateUnstamped
	case isThisTap && pending.Passes > 1:
		return StateConfirmed
	case isThisTap:
		return StateCandidate
	default:
		return StateStale
	}
}

// Pending returns the candidates awaiting confirmation, oldest first.
func (v *Views) Pending() []reclaim.Pending {
	p := v.Reclaimer.Pending()
	slices.SortFunc(p, func(x, y reclaim.Pending) int { return x.FirstSeen.Compare(y.FirstSeen) })
	return p
}

// ForcePass runs a pass now, after any in flight. Like every pass, it runs
// to its end even if ctx is cancelled (see reclaim.Reclaimer.Pass).
func (v *Views) ForcePass(ctx context.Context, opts reclaim.PassOptions) reclaim.Report {
	return v.Reclaimer.Pass(ctx, opts)
}

// Reports returns recent pass reports, newest first.
func (v *Views) Reports() []reclaim.Report { return v.Reclaimer.Reports() }

// Ready returns nil when the maps are loaded and the inventory is synced
// and reading.
func (v *Views) Ready(ctx context.Context) error {
	if v.Datapath == nil {
		return errors.New("eBPF maps not loaded")
	}
	snap := v.Inventory.Snapshot(ctx)
	if snap.Err != nil {
		return fmt.Errorf("inventory: %w", snap.Err)
	}
	if !snap.Synced {
		return inventory.ErrNotSynced
	}
	if p, ok := v.Inventory.(inventory.Proven); ok && v.MaxInventoryAge > 0 {
		at := p.ProvenAt()
		if at.IsZero() {
			return fmt.Errorf("%w: no consistent read of the API server has succeeded yet", inventory.ErrNotProvenCurrent)
		}
		// The age runs from the start of the newest consistent read that
		// succeeded, so a slow API server or link shows in it.
		if age := time.Since(at); age > v.MaxInventoryAge {
			return fmt.Errorf("%w: last proven %s ago, bound %s", inventory.ErrNotProvenCurrent, age.Round(time.Second), v.MaxInventoryAge)
		}
	}
	return nil
}

// Status is the node at a glance, for `galactic-node status`.
type Status struct {
	Ready    bool             `json:"ready"`
	Reason   string           `json:"reason,omitempty"`
	Schedule reclaim.Schedule `json:"schedule"`
	// Brake is the mass-removal brake: while engaged, passes remove
	// nothing until an operator releases it or the inventory stays stable.
	Brake reclaim.Brake `json:"brake"`
	// LastPass is the newest pass's report without its lists.
	LastPass *PassSummary `json:"lastPass,omitempty"`
	// InventoryProvenAt is when the cluster inventory last showed itself
	// current; zero for a file inventory.
	InventoryProvenAt time.Time `json:"inventoryProvenAt,omitzero"`
	Maps              []MapFill `json:"maps"`
	// HolderScan says whether the scan that names holders saw every
	// process. No removal depends on it.
	HolderScan HolderScanStatus `json:"holderScan"`
	Programs   ProgramStatus    `json:"programs"`
	// Unbound are the taps taken over from an older build that run without
	// anti-spoofing until an ADD binds them (GalacticTapsUnbound).
	Unbound UnboundStatus `json:"unbound"`
	// Records is the CNI records' collection; absent when the daemon
	// collects none.
	Records *RecordsStatus `json:"records,omitempty"`
}

// RecordsSource is the CNI records' collection, as the daemon runs it.
type RecordsSource interface {
	RecordsStatus() RecordsStatus
}

// RecordsStatus is what the last round of the CNI records' collection
// did, and what it left for want of evidence that the tap is gone.
type RecordsStatus struct {
	Folder    string    `json:"folder"`
	At        time.Time `json:"at,omitzero"`
	Collected int       `json:"collected"`
	// Kept counts the records the round did not judge, and KeptWhy says
	// why: the daemon does not see the network namespace they were
	// written in, so a tap it cannot see there is no evidence of a tap
	// gone.
	Kept    int    `json:"kept,omitempty"`
	KeptWhy string `json:"keptWhy,omitempty"`
	Error   string `json:"error,omitempty"`
}

// UnboundStatus counts the unbound taps and names the first MaxNamedUnbound.
type UnboundStatus struct {
	Count int      `json:"count"`
	Taps  []string `json:"taps"`
	Error string   `json:"error,omitempty"`
}

// MaxNamedUnbound bounds the taps /v1/status names; taps names them all.
const MaxNamedUnbound = 20

// unboundTaps returns the ifindexes whose tap_rules row is marked unbound.
func (v *Views) unboundTaps() (map[uint32]bool, error) {
	if v.Datapath == nil {
		return nil, errors.New("no datapath opened")
	}
	rows, err := v.Datapath.TapRules.Dump(0)
	if err != nil {
		return nil, fmt.Errorf("read tap_rules: %w", err)
	}
	out := map[uint32]bool{}
	for _, r := range rows {
		if r.Value.Unbound && r.Value.Ifindex == r.Key {
			out[r.Key] = true
		}
	}
	return out, nil
}

// Unbound counts and names the unbound taps.
func (v *Views) Unbound(ctx context.Context) UnboundStatus {
	st := UnboundStatus{Taps: []string{}}
	unbound, err := v.unboundTaps()
	if err != nil {
		st.Error = err.Error()
		return st
	}
	st.Count = len(unbound)
	if st.Count == 0 || v.Links == nil {
		return st
	}
	links, err := v.Links.Links(ctx)
	if err != nil {
		st.Error = err.Error()
		return st
	}
	for _, l := range links {
		if unbound[l.Index] && len(st.Taps) < MaxNamedUnbound {
			st.Taps = append(st.Taps, l.Name)
		}
	}
	slices.Sort(st.Taps)
	return st
}

// ProgramStatus says which program the daemon runs and how many attached
// interfaces run another (an older build's, until the daemon moves them).
type ProgramStatus struct {
	Current attachreg.Program `json:"current"`
	Links   int               `json:"links"`
	OnOther int               `json:"onOther"`
	Error   string            `json:"error,omitempty"`
}

// Programs counts the attached interfaces by the program they run.
func (v *Views) Programs() ProgramStatus {
	st := ProgramStatus{Current: attachreg.Program{ID: v.Datapath.ProgramID(), Name: datapath.ProgramName(), Current: true}}
	if v.Registry == nil {
		return st
	}
	progs, err := v.Registry.Programs()
	if err != nil {
		st.Error = err.Error()
	}
	for _, p := range progs {
		st.Links++
		if !p.Current {
			st.OnOther++
		}
	}
	return st
}

// HolderScanStatus is the last holder scan's reach.
type HolderScanStatus struct {
	Complete bool `json:"complete"`
	// Reason is why the scan may miss holders, when it is not complete.
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at,omitzero"`
}

// HolderScan reports the reach of a recent holder scan.
func (v *Views) HolderScan(ctx context.Context) HolderScanStatus {
	scan, at := v.scan(ctx, scanMaxAge)
	ok, why := scan.Complete()
	return HolderScanStatus{Complete: ok, Reason: why, At: at}
}

// PassSummary is a pass report's head.
type PassSummary struct {
	Started   time.Time      `json:"started"`
	Finished  time.Time      `json:"finished"`
	Result    reclaim.Result `json:"result"`
	Reason    string         `json:"reason,omitempty"`
	DryRun    bool           `json:"dryRun"`
	Reclaimed int            `json:"reclaimed"`
	Failed    int            `json:"failed"`
}

// MapFill is how full one eBPF map is.
type MapFill struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Rows       int    `json:"rows"`
	MaxEntries uint32 `json:"maxEntries"`
}

// Status gathers readiness, the pass schedule, the last pass, the
// inventory's health and how full each map is.
func (v *Views) Status(ctx context.Context) Status {
	st := Status{Ready: true, Schedule: v.Reclaimer.Schedule(), Brake: v.Reclaimer.Brake(), Maps: []MapFill{}}
	if err := v.Ready(ctx); err != nil {
		st.Ready, st.Reason = false, err.Error()
	}
	if reps := slices.DeleteFunc(v.Reclaimer.Reports(), func(r reclaim.Report) bool { return r.Result == reclaim.ResultRunning }); len(reps) > 0 {
		r := reps[0]
		st.LastPass = &PassSummary{Started: r.Started, Finished: r.Finished, Result: r.Result, Reason: r.Reason,
			DryRun: r.DryRun, Reclaimed: len(r.Reclaimed), Failed: len(r.Failed)}
	}
	if p, ok := v.Inventory.(inventory.Proven); ok {
		st.InventoryProvenAt = p.ProvenAt()
	}
	st.HolderScan = v.HolderScan(ctx)
	if v.Records != nil {
		r := v.Records.RecordsStatus()
		st.Records = &r
	}
	if v.Datapath != nil {
		st.Programs = v.Programs()
		st.Unbound = v.Unbound(ctx)
		for _, t := range v.Datapath.Tables() {
			l := t.Layout()
			fill := MapFill{Name: l.Name, Type: l.Type, MaxEntries: l.MaxEntries, Rows: -1} // -1: could not be counted
			if rows, err := t.DumpAny(0); err == nil {
				fill.Rows = len(rows)
			}
			st.Maps = append(st.Maps, fill)
		}
	}
	return st
}

// MapView describes one eBPF map.
type MapView struct {
	datapath.Layout
	Rows         int  `json:"rows"`
	PerInterface bool `json:"perInterface"`
	// Orphans counts the map's rows keyed by an ifindex that has no link:
	// what the orphan collection will clear.
	Orphans int `json:"orphans"`
}

// Maps describes every map of the datapath.
func (v *Views) Maps(ctx context.Context) ([]MapView, error) {
	orphans, err := v.orphansByMap(ctx)
	if err != nil {
		return nil, err
	}
	per := v.Registry.PerInterfaceMaps()
	var out []MapView
	for _, t := range v.Datapath.Tables() {
		rows, err := t.DumpAny(0)
		if err != nil {
			return nil, err
		}
		out = append(out, MapView{Layout: t.Layout(), Rows: len(rows), PerInterface: slices.Contains(per, t.Name()), Orphans: orphans[t.Name()]})
	}
	return out, nil
}

// orphansByMap counts, per map, the rows of ifindexes that have no link.
func (v *Views) orphansByMap(ctx context.Context) (map[string]int, error) {
	links, err := v.Links.Links(ctx)
	if err != nil {
		return nil, fmt.Errorf("count orphan rows: %w", err)
	}
	live := make(map[uint32]bool, len(links))
	for _, l := range links {
		live[l.Index] = true
	}
	regs, err := v.Registry.Registered()
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, r := range regs {
		if live[r.Ifindex] {
			continue
		}
		for m, n := range r.Rows {
			out[m] += n
		}
	}
	return out, nil
}

// MapRows returns up to limit rows of the map called name; a non-zero
// ifindex keeps only that interface's rows. An unknown name is
// datapath.ErrUnknownMap.
func (v *Views) MapRows(name string, ifindex uint32, limit int) ([]datapath.Row[any, any], error) {
	if ifindex == 0 {
		return v.Registry.Dump(name, limit)
	}
	if _, err := v.Datapath.Table(name); err != nil {
		return nil, err
	}
	if !slices.Contains(v.Registry.PerInterfaceMaps(), name) {
		return nil, fmt.Errorf("map %s: %w", name, ErrNotKeyedByInterface)
	}
	rows, err := v.Registry.Dump(name, 0)
	if err != nil {
		return nil, err
	}
	out := []datapath.Row[any, any]{}
	for _, r := range rows {
		if keyIfindex(r.Key) == ifindex {
			out = append(out, r)
			if limit > 0 && len(out) == limit {
				break
			}
		}
	}
	return out, nil
}

func keyIfindex(k any) uint32 {
	switch k := k.(type) {
	case uint32:
		return k
	case datapath.HostPort:
		return k.Ifindex
	}
	return 0
}

// InterfaceRows returns every row of one interface across the maps.
func (v *Views) InterfaceRows(ifindex uint32) (attachreg.InterfaceRows, error) {
	return v.Registry.Rows(ifindex)
}

// ErrNoDropMonitor: the node reads no records of dropped frames.
var ErrNoDropMonitor = errors.New("no drop monitor on this node")

func (v *Views) dropWatch() (*dropwatch.Watch, error) {
	if v.Drops == nil {
		why := v.DropsUnavailable
		if why == "" {
			why = "not started"
		}
		return nil, fmt.Errorf("%w: %s", ErrNoDropMonitor, why)
	}
	return v.Drops, nil
}

// RecentDrops returns the newest kept records of dropped frames f selects.
func (v *Views) RecentDrops(f dropwatch.Filter) ([]dropwatch.Record, error) {
	w, err := v.dropWatch()
	if err != nil {
		return nil, err
	}
	return w.Recent(f), nil
}

// FollowDrops starts a live feed of the records f selects.
func (v *Views) FollowDrops(f dropwatch.Filter) (*dropwatch.Follower, error) {
	w, err := v.dropWatch()
	if err != nil {
		return nil, err
	}
	return w.Follow(f)
}
