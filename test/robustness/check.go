package robustness

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Rules are the daemon's settings the checker judges a history by.
type Rules struct {
	// MinCandidateAge is the daemon's --min-candidate-age: no tap may go
	// sooner after it became stale (its identity gone, its last holder
	// gone, or its making, whichever came last).
	MinCandidateAge time.Duration
	// Visible bounds how long after the harness saw a tap gone the pass
	// that removed it may still not list it (as removing or reclaimed):
	// zero, the first read of /v1/passes that starts after the links
	// were read without it must list it.
	Visible time.Duration
}

// Violation is one broken rule, with the events that show it.
type Violation struct {
	Rule string
	At   time.Time
	Tap  string
	What string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s at %s: %s", v.Rule, v.Tap, v.At.Format("15:04:05.000"), v.What)
}

// The rules a Violation names.
const (
	RuleHeld       = "safety/held"
	RuleCarried    = "safety/carried"
	RuleAge        = "safety/min-age"
	RuleBrake      = "safety/brake"
	RuleUnreported = "accounting/unreported"
	RuleTwice      = "accounting/reported-twice"
	RuleInvented   = "accounting/reported-not-removed"
	RuleLate       = "accounting/not-visible"
	RuleRestart    = "restart/brake"
	RuleResidue    = "quiescence/residue"
	RuleLiveness   = "liveness/stale-tap-left"
)

// removal is a tap the harness saw go: present at lastSeen, gone at gone.
type removal struct {
	tap       string
	ifindex   uint32
	lastSeen  time.Time
	gone      time.Time
	byHarness bool
}

// span is an interval; an open one has a zero end.
type span struct{ start, end time.Time }

func (s span) covers(from, to time.Time) bool {
	return !s.start.After(from) && (s.end.IsZero() || !s.end.Before(to))
}

func (s span) overlaps(from, to time.Time) bool {
	return !s.start.After(to) && (s.end.IsZero() || !s.end.Before(from))
}

// timeline is what the harness did to each tap, as spans.
type timeline struct {
	removes  map[string][]span // by tap; "" for an operation on every tap
	holds    map[string][]span // by tap and ifindex (ref): a VMM holds one incarnation
	carried  map[string][]span
	makes    map[string][]time.Time
	releases []span
	passes   []span
	kills    []time.Time
}

func build(events []Event) timeline {
	tl := timeline{removes: map[string][]span{}, holds: map[string][]span{}, carried: map[string][]span{}, makes: map[string][]time.Time{}}
	open := func(m map[string][]span, tap string, at time.Time) { m[tap] = append(m[tap], span{start: at}) }
	closeLast := func(m map[string][]span, tap string, at time.Time) {
		s := m[tap]
		for i := len(s) - 1; i >= 0; i-- {
			if s[i].end.IsZero() {
				s[i].end = at
				return
			}
		}
	}
	for _, e := range events {
		switch e.Kind {
		case RemoveStart:
			open(tl.removes, e.Tap, e.At)
		case RemoveEnd:
			closeLast(tl.removes, e.Tap, e.At)
		case HoldOpened:
			open(tl.holds, ref(e.Tap, e.Ifindex), e.At)
		case HoldClosed:
			closeLast(tl.holds, ref(e.Tap, e.Ifindex), e.At)
		case AttachmentCreated:
			open(tl.carried, e.Tap, e.At)
		case AttachmentDeleted:
			closeLast(tl.carried, e.Tap, e.At)
		case TapMakeStart:
			tl.makes[e.Tap] = append(tl.makes[e.Tap], e.At)
		case ReleaseStart:
			tl.releases = append(tl.releases, span{start: e.At})
		case ReleaseEnd:
			if n := len(tl.releases); n > 0 && tl.releases[n-1].end.IsZero() {
				tl.releases[n-1].end = e.At
			}
		case DaemonKilled:
			tl.kills = append(tl.kills, e.At)
		case PassStart:
			tl.passes = append(tl.passes, span{start: e.At})
		case PassEnd:
			for i := len(tl.passes) - 1; i >= 0; i-- {
				if tl.passes[i].end.IsZero() {
					tl.passes[i].end = e.At
					break
				}
			}
		}
	}
	return tl
}

// removals lists every tap that went, from the views of the links.
func removals(events []Event, tl timeline) []removal {
	var out []removal
	var prev map[string]uint32
	for _, e := range events {
		if e.Kind != LinksSeen {
			continue
		}
		for name, ifindex := range prev {
			if now, ok := e.Taps[name]; ok && now == ifindex {
				continue
			}
			r := removal{tap: name, ifindex: ifindex, lastSeen: e.Since, gone: e.At}
			for _, s := range append(slices.Clone(tl.removes[name]), tl.removes[""]...) {
				if s.overlaps(r.lastSeen, r.gone) {
					r.byHarness = true
				}
			}
			out = append(out, r)
		}
		prev = e.Taps
	}
	sort.Slice(out, func(i, j int) bool { return out[i].gone.Before(out[j].gone) })
	return out
}

// staleSince is when the tap's incarnation last seen at lastSeen became
// stale: the last of its making, its last holder leaving and its identity
// going, before gone. A hold or an identity that came and went while no
// pass ran is not counted: the daemon judges a tap at its passes (two
// sightings, and the age since the first), so one that lived only between
// two of them is not something it could have seen.
func (tl timeline) staleSince(tap string, ifindex uint32, lastSeen, gone time.Time) time.Time {
	var since time.Time
	for _, at := range tl.makes[tap] {
		if !at.After(lastSeen) && at.After(since) {
			since = at
		}
	}
	for _, spans := range [][]span{tl.holds[ref(tap, ifindex)], tl.carried[tap]} {
		for _, s := range spans {
			if !s.end.IsZero() && !s.end.After(gone) && s.end.After(since) && tl.seenByAPass(s) {
				since = s.end
			}
		}
	}
	return since
}

// seenByAPass reports whether a pass was in flight at some moment of s.
func (tl timeline) seenByAPass(s span) bool {
	for _, p := range tl.passes {
		if p.overlaps(s.start, s.end) {
			return true
		}
	}
	return false
}

// Check judges a history by rules and returns every violation in it.
func Check(events []Event, rules Rules) []Violation {
	tl := build(events)
	var vs []Violation
	add := func(rule string, at time.Time, tap, format string, args ...any) {
		vs = append(vs, Violation{Rule: rule, At: at, Tap: tap, What: fmt.Sprintf(format, args...)})
	}

	reported := map[string][]Event{} // by ref
	for _, e := range events {
		if e.Kind == Reported {
			reported[ref(e.Tap, e.Ifindex)] = append(reported[ref(e.Tap, e.Ifindex)], e)
		}
	}
	gone := removals(events, tl)
	removedRefs := map[string]bool{}
	for _, r := range gone {
		removedRefs[ref(r.tap, r.ifindex)] = true
		if r.byHarness {
			continue
		}
		for _, s := range tl.holds[ref(r.tap, r.ifindex)] {
			if s.covers(r.lastSeen, r.gone) {
				add(RuleHeld, r.gone, r.tap, "removed by the daemon (seen at %s, gone at %s) while a VMM held it since %s",
					clock(r.lastSeen), clock(r.gone), clock(s.start))
			}
		}
		// The daemon proves the inventory when a pass starts: an identity
		// created after that start and before the removal is a race the
		// node does not close (docs/robustness.md); one created before it is
		// a removal of a live tap.
		proof := r.lastSeen
		if reps := reported[ref(r.tap, r.ifindex)]; len(reps) > 0 {
			if started, err := time.Parse(time.RFC3339Nano, reps[0].Pass); err == nil && started.Before(proof) {
				proof = started
			}
		}
		for _, s := range tl.carried[r.tap] {
			if s.covers(proof, r.gone) {
				add(RuleCarried, r.gone, r.tap, "removed by the daemon (gone at %s) while its VPCAttachment, stored at %s, still carried its identity",
					clock(r.gone), clock(s.start))
			}
		}
		if since := tl.staleSince(r.tap, r.ifindex, r.lastSeen, r.gone); !since.IsZero() && r.gone.Sub(since) < rules.MinCandidateAge {
			add(RuleAge, r.gone, r.tap, "removed by the daemon %s after it became stale (at %s), under the minimum age %s",
				r.gone.Sub(since).Round(time.Millisecond), clock(since), rules.MinCandidateAge)
		}
		if b := brakeHeld(events, tl, r); b != nil {
			add(RuleBrake, r.gone, r.tap, "removed by the daemon while the brake engaged at %s (%q) held, with no release", clock(b.Since), b.Reason)
		}
		checkAccounting(events, tl, r, reported[ref(r.tap, r.ifindex)], rules, add)
	}
	for key, reps := range reported {
		if !removedRefs[key] {
			add(RuleInvented, reps[0].At, key, "a pass (started %s) reports removing it, and no view of the links saw it go", reps[0].Pass)
		}
	}
	for _, e := range events {
		switch e.Kind {
		case RestartBrake:
			if e.Brake != nil && e.After != nil && !e.Brake.Same(*e.After) {
				add(RuleRestart, e.At, "", "the brake before a SIGKILL was %+v, after the restart %+v", *e.Brake, *e.After)
			}
		case Residue:
			add(RuleResidue, e.At, e.Tap, "%s", e.Detail)
		case Settled:
			for name, ifindex := range e.Taps {
				if tl.live(name, ifindex, e.At) {
					continue
				}
				add(RuleLiveness, e.At, name, "still on the node once faults stopped and the liveness bound passed: no hold, no identity carried")
			}
		}
	}
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].At.Before(vs[j].At) })
	return vs
}

// live reports whether a tap is held or carried at at.
func (tl timeline) live(tap string, ifindex uint32, at time.Time) bool {
	for _, spans := range [][]span{tl.holds[ref(tap, ifindex)], tl.carried[tap]} {
		for _, s := range spans {
			if s.covers(at, at) {
				return true
			}
		}
	}
	return false
}

// brakeHeld returns the brake that held throughout r's window: seen
// engaged before the tap was last seen, and the same engagement (its
// since) seen again after it went, with no operator release in between.
func brakeHeld(events []Event, tl timeline, r removal) *Brake {
	var before, after *Brake
	var beforeAt, afterAt time.Time
	for _, e := range events {
		if e.Kind != BrakeSeen || e.Brake == nil {
			continue
		}
		if !e.At.After(r.lastSeen) {
			before, beforeAt = e.Brake, e.At
		} else if !e.At.Before(r.gone) && after == nil {
			after, afterAt = e.Brake, e.At
		}
	}
	if before == nil || after == nil || !before.Engaged || !after.Engaged || !before.Since.Equal(after.Since) {
		return nil
	}
	for _, s := range tl.releases {
		if s.overlaps(beforeAt, afterAt) {
			return nil
		}
	}
	return before
}

// checkAccounting: a removal the daemon made appears in exactly one pass
// report, and in the first read of /v1/passes Visible after it was seen;
// unless the daemon was killed before either could be read, which takes
// its reports with it.
func checkAccounting(events []Event, tl timeline, r removal, reps []Event, rules Rules, add func(string, time.Time, string, string, ...any)) {
	key := ref(r.tap, r.ifindex)
	passes := map[string]bool{}
	for _, e := range reps {
		passes[e.Pass] = true
	}
	if len(passes) > 1 {
		add(RuleTwice, r.gone, r.tap, "removal of ifindex %d reported by %d passes", r.ifindex, len(passes))
	}
	var read *Event
	for i := range events {
		e := &events[i]
		if e.Kind == PassesSeen && !e.At.Before(r.gone.Add(rules.Visible)) {
			read = e
			break
		}
	}
	killedBy := func(until time.Time) bool {
		for _, k := range tl.kills {
			if !k.Before(r.lastSeen) && !k.After(until) {
				return true
			}
		}
		return false
	}
	if read == nil || killedBy(read.At) {
		return // no read of the passes before the daemon went: nothing to judge by
	}
	if !slices.Contains(read.Refs, key) {
		add(RuleLate, r.gone, r.tap, "gone at %s and /v1/passes read at %s does not list its removal: it looks gone some other way",
			clock(r.gone), clock(read.At))
	}
	// A delete under way when the daemon died is named as removing and
	// never as reclaimed: the pass that would have said so died with it.
	if len(passes) == 0 && !killedBy(r.gone.Add(reportBound)) {
		add(RuleUnreported, r.gone, r.tap, "removed by the daemon (ifindex %d, gone at %s) and no pass report lists it", r.ifindex, clock(r.gone))
	}
}

// reportBound is how long after a removal was seen a daemon that lives on
// has surely listed it as reclaimed, and the harness read that: the pass
// lists it the moment its delete returns, and the harness reads
// /v1/passes every few milliseconds.
const reportBound = time.Second

func clock(t time.Time) string { return t.Format("15:04:05.000") }

// Summary counts a history's events by kind, for the run's report.
func Summary(events []Event) string {
	counts := map[Kind]int{}
	for _, e := range events {
		counts[e.Kind]++
	}
	kinds := make([]string, 0, len(counts))
	for k := range counts {
		kinds = append(kinds, string(k))
	}
	slices.Sort(kinds)
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, "%s=%d ", k, counts[Kind(k)])
	}
	return strings.TrimSpace(b.String())
}
