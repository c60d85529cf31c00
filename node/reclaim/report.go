package reclaim

import (
	"slices"
	"time"

	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// Report is what one pass read, decided and did.
type Report struct {
	Started time.Time `json:"started"`
	// Finished is zero, and left out, while the pass runs.
	Finished time.Time `json:"finished,omitzero"`
	DryRun   bool      `json:"dryRun"`
	Result   Result    `json:"result"`
	// Reason says why the pass removed nothing, when it was skipped or failed.
	Reason string `json:"reason,omitempty"`
	Inputs Inputs `json:"inputs"`

	Candidates []CandidateReport `json:"candidates"`
	// Confirmed are the taps this pass found stale long enough to remove:
	// what an operator reading "confirmed" next to a brake that "held 3
	// confirmed taps" expects to count. It is no promise of a removal:
	// Held, RolledOver, Kept, Failed and WouldReclaim say what became of
	// them. Nothing counts removals from it (the metrics and events count
	// Reclaimed), so listing the held ones here moves no removal count.
	Confirmed []TapRef `json:"confirmed"`
	// Held are the confirmed taps the mass-removal brake kept, all of a
	// braked pass's: listed apart so that a script can still tell the
	// confirmed taps a pass went on to remove (Confirmed without Held).
	Held         []TapRef `json:"held,omitempty"`
	WouldReclaim []TapRef `json:"wouldReclaim,omitempty"`
	Reclaimed    []TapRef `json:"reclaimed"`
	// Removing, in the pass in flight only, are the taps whose delete is
	// under way: gone from the node's links, perhaps, and not yet in
	// Reclaimed (teardown.Outcome.Removing).
	Removing   []TapRef  `json:"removing,omitempty"`
	Kept       []Kept    `json:"kept"`
	Failed     []Failure `json:"failed"`
	RolledOver int       `json:"rolledOver"`
	// Brake is set when the mass-removal brake kept every confirmed tap,
	// or was released, in this pass.
	Brake *BrakeReport `json:"brake,omitempty"`

	// Orphans are interfaces whose rows or pin outlived their link, as
	// this pass found them; a second sighting clears them.
	Orphans           []OrphanReport `json:"orphans,omitempty"`
	OrphansCleared    []OrphanReport `json:"orphansCleared,omitempty"`
	OrphansWouldClear []OrphanReport `json:"orphansWouldClear,omitempty"`
	OrphanErrors      []string       `json:"orphanErrors,omitempty"`

	// Preview is a dry run forced on a node that removes: it recorded
	// nothing a later pass decides by (PassOptions.DryRun), so its first
	// sightings start no confirmation and its brake is what a real pass
	// would meet. NotDone says what that real pass would have done and it
	// did not.
	Preview bool     `json:"preview,omitempty"`
	NotDone []string `json:"notDone,omitempty"`
}

// Inputs counts what a pass read. Nothing in it grows with the cluster's
// objects: the pass keeps its reports (Config.History) and serves them, so a
// list of what tenants made would cost memory and bytes on every node in
// proportion to the cluster.
type Inputs struct {
	Links          int `json:"links"`
	TenantTaps     int `json:"tenantTaps"`
	StampedTaps    int `json:"stampedTaps"`
	Identities     int `json:"identities"`
	Attachments    int `json:"attachments"`
	Advertisements int `json:"advertisements"`
	// MalformedObjects counts the objects whose identity fields are set
	// but do not parse; MalformedSample names the first MaxMalformedSample
	// of them (in the inventory's sorted order, so the same ones pass
	// after pass) and what did not parse in each.
	MalformedObjects int      `json:"malformedObjects"`
	MalformedSample  []string `json:"malformedSample,omitempty"`
}

// MaxMalformedSample bounds Inputs.MalformedSample: enough to find the
// objects' pattern, a constant however many a tenant makes.
const MaxMalformedSample = inventory.MaxNamed

// malformedInputs fills in's malformed count and sample from snap, and
// returns the count of each kind, for the Observer.
func malformedInputs(in *Inputs, snap *inventory.Snapshot) MalformedCount {
	in.MalformedObjects = snap.Malformed()
	in.MalformedSample = nil
	for _, ref := range snap.MalformedSample[:min(len(snap.MalformedSample), MaxMalformedSample)] {
		s := ref.String()
		if why := snap.MalformedWhy[ref]; why != "" {
			s += ": " + why
		}
		in.MalformedSample = append(in.MalformedSample, s)
	}
	return MalformedCount{Attachments: snap.MalformedAttachments, Advertisements: snap.MalformedAdvertisements}
}

// TapRef names a tap as a pass saw it.
type TapRef = teardown.TapRef

// CandidateReport is one candidate and why it is one.
type CandidateReport struct {
	Tap       TapRef    `json:"tap"`
	FirstSeen time.Time `json:"firstSeen"`
	// EligibleAt is when a pass may confirm it: first seen plus the
	// minimum candidate age.
	EligibleAt time.Time `json:"eligibleAt"`
	Passes     int       `json:"passes"`
	Why        string    `json:"why"`
}

// Kept is a confirmed tap a check before its delete kept (the link read
// again, the inventory recheck, the kernel probe), and why.
type Kept = teardown.Kept

// Failure is a confirmed tap whose removal failed at a stage; it is kept and
// retried by a later pass (at StageRows the tap is gone and its rows are
// left for the orphan collection).
type Failure = teardown.Failure

// Pending is a candidate awaiting confirmation, for views.
type Pending struct {
	Tap       TapRef    `json:"tap"`
	FirstSeen time.Time `json:"firstSeen"`
	// EligibleAt is the time from which a pass may confirm it: first seen
	// plus the minimum candidate age.
	EligibleAt time.Time `json:"eligibleAt"`
	Passes     int       `json:"passes"`
}

// Pending returns the candidates the next pass will confirm against.
func (r *Reclaimer) Pending() []Pending {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Pending, 0, len(r.candidates))
	for _, c := range r.candidates {
		out = append(out, Pending{Tap: c.TapRef, FirstSeen: c.firstSeen, EligibleAt: r.eligibleAt(c), Passes: c.passes})
	}
	return out
}

// Reports returns the kept pass reports, newest first: the pass in flight,
// if any, first, with result running and what it did so far.
func (r *Reclaimer) Reports() []Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Report, 0, len(r.history)+1)
	if r.running != nil {
		run := *r.running
		run.Candidates, run.Confirmed, run.Held = slices.Clone(run.Candidates), slices.Clone(run.Confirmed), slices.Clone(run.Held)
		run.Reclaimed, run.WouldReclaim = slices.Clone(run.Reclaimed), slices.Clone(run.WouldReclaim)
		run.Kept, run.Failed = slices.Clone(run.Kept), slices.Clone(run.Failed)
		out = append(out, run)
	}
	for _, rep := range slices.Backward(r.history) {
		out = append(out, rep)
	}
	return out
}
