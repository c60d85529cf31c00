package hub

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/datum-cloud/galactic-node/hubctl"
)

// The rules Check holds a history to.
const (
	// RuleIdentityLost: a network's fabric identity was deleted while the
	// network lived. One case is let through, on evidence: the race
	// docs/hub.md accepts, "A network re-created between the read and the
	// deletes". An identity written for an earlier network of the name may
	// go under the network re-created after it, when a replica read the
	// name gone past its cache (a LIST served at a revision at or after
	// the earlier network's deletion and before the re-create, or a GET
	// answered 404 that began before the re-create was answered and ended
	// after the deletion began): the collect that read rests on deleted
	// it, and the identity is written again. No clock but the API
	// server's, and no revision but etcd's, decides it. An identity
	// written while the network lived that deletes it is never let
	// through: the steady networks the scene creates first and never
	// deletes have only such.
	RuleIdentityLost = "identity-lost"
	// RuleIdentityChanged: a network name was given two fabric IDs (its
	// claim's retained block keeps the ID across re-creations: rule 4), or
	// an identity was changed in place (identities are immutable).
	RuleIdentityChanged = "identity-changed"
	// RuleBlockShared: one block (fabric ID) was bound to, or written for,
	// two networks. The address services here never free a retained block
	// (no retention lease), so a block is one network name's for ever.
	RuleBlockShared = "block-shared"
	// RuleGoneHoldsClaim: once settled, a gone network still holds a claim
	// whose allocation is recorded Retain, and with it a quota unit.
	// (Claims recorded otherwise are kept on purpose: rule 2.)
	RuleGoneHoldsClaim = "gone-network-holds-claim"
	// RuleWaitsWithUnitFree: once settled, a live network has no identity
	// while the quota has a unit free.
	RuleWaitsWithUnitFree = "live-network-waits-with-a-unit-free"
)

// Violation is a rule a history breaks.
type Violation struct {
	T      time.Time
	Rule   string
	Detail string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s at %s: %s", v.Rule, v.T.Format("15:04:05.000"), v.Detail)
}

// Check returns every violation of the rules in a history: those over the
// whole history (identities kept, blocks never shared), and, when the
// history ends with a snapshot, those of a settled hub (CheckSettled).
func Check(events []Event) []Violation { return check(events, time.Time{}) }

// CheckSoFar is Check over a history still being written: an identity
// deleted after judgedBefore is not judged yet, since the network watch,
// a stream of its own, may not have delivered that network's deletion.
func CheckSoFar(events []Event, judgedBefore time.Time) []Violation {
	return check(events, judgedBefore)
}

// check is Check judging identity deletions observed before before (all
// when zero).
func check(events []Event, before time.Time) []Violation {
	vs, _ := checkIdentities(events, before)
	vs = append(vs, checkBlocks(events)...)
	if s, at := lastSnapshot(events); s != nil {
		for _, v := range CheckSettled(*s) {
			v.T = at
			vs = append(vs, v)
		}
	}
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].T.Before(vs[j].T) })
	return vs
}

// incarnation is one life of a network name, between the revisions of its
// creation and deletion (0: alive at the end of the history).
type incarnation struct {
	uid          string
	created, end uint64
	gap          bool // a watch gap hides when it began or ended
}

// identityObject is one NetworkFabricIdentity object, by UID.
type identityObject struct {
	network      string
	fabricID     uint32
	created, end uint64
	gap          bool
	ended        time.Time
}

// Excused counts the identities a history shows deleted under a
// re-created network on a read that found the name gone: the race
// docs/hub.md accepts, let through on that evidence.
func Excused(events []Event) int {
	_, n := checkIdentities(events, time.Time{})
	return n
}

// checkIdentities holds RuleIdentityLost and RuleIdentityChanged, and
// counts the deletions it excused.
func checkIdentities(events []Event, before time.Time) ([]Violation, int) {
	lives := map[string][]*incarnation{}
	current := map[string]*incarnation{}
	ids := map[string]*identityObject{}
	var order []string
	var vs []Violation
	firstID := map[string]uint32{}
	ev := evidence{stored: map[string]Event{}}
	for _, e := range events {
		switch e.Kind {
		case KindRead:
			ev.reads = append(ev.reads, e)
			continue
		case KindStored:
			ev.stored[e.What+" "+e.UID] = e
			continue
		case KindObserve:
		default:
			continue
		}
		switch e.Object {
		case ObjectNetwork:
			switch e.What {
			case "added":
				in := &incarnation{uid: e.UID, created: e.RV, gap: e.Gap}
				lives[e.Network] = append(lives[e.Network], in)
				current[e.Network] = in
			case "deleted":
				if in := current[e.Network]; in != nil && in.uid == e.UID {
					in.end = e.RV
					in.gap = in.gap || e.Gap
					delete(current, e.Network)
				}
			}
		case ObjectIdentity:
			obj := ids[e.UID]
			switch e.What {
			case "added":
				obj = &identityObject{network: e.Network, fabricID: e.FabricID, created: e.RV, gap: e.Gap}
				ids[e.UID] = obj
				order = append(order, e.UID)
			case "modified":
				if obj != nil && e.FabricID != obj.fabricID {
					vs = append(vs, Violation{e.T, RuleIdentityChanged,
						fmt.Sprintf("the identity of %s was changed in place from fabric ID %d to %d", e.Network, obj.fabricID, e.FabricID)})
				}
			case "deleted":
				if obj != nil {
					obj.end, obj.ended = e.RV, e.T
					obj.gap = obj.gap || e.Gap
				}
			}
			if e.What != "deleted" && e.FabricID != 0 {
				if first, ok := firstID[e.Network]; !ok {
					firstID[e.Network] = e.FabricID
				} else if first != e.FabricID {
					vs = append(vs, Violation{e.T, RuleIdentityChanged,
						fmt.Sprintf("%s was given fabric ID %d, having had %d: its block was not kept", e.Network, e.FabricID, first)})
				}
			}
		}
	}
	excused := 0
	for _, uid := range order {
		obj := ids[uid]
		if obj.end == 0 || obj.gap || (!before.IsZero() && !obj.ended.Before(before)) {
			continue
		}
		// The network living when the identity was deleted: if it is the
		// one the identity was written for, the identity was lost; if a
		// later one, which found the identity in place, lost unless a
		// replica's read had found the name gone before it came.
		in := liveAt(lives[obj.network], obj.end)
		if in == nil || in.gap {
			continue // deleted with no network living, or one whose life the watch lost
		}
		if in != liveAt(lives[obj.network], obj.created) && ev.readGoneBefore(obj.network, lives[obj.network], in) {
			excused++
			continue
		}
		vs = append(vs, Violation{obj.ended, RuleIdentityLost,
			fmt.Sprintf("the identity of live network %s (uid %s), fabric ID %d, written at revision %d, was deleted at revision %d, while the network lived (deleted at %s)",
				obj.network, in.uid, obj.fabricID, obj.created, obj.end, revision(in.end))})
	}
	return vs, excused
}

// evidence is what the audit log shows of the replicas' reads past their
// caches, and of the networks' creates and deletes, by UID.
type evidence struct {
	reads  []Event
	stored map[string]Event // "create <uid>", "delete <uid>"
}

// readGoneBefore reports whether a replica read network gone after the
// incarnation before in ended and before in was created: a LIST served
// at a revision in between, or a GET answered 404 that began before in's
// create was answered and ended after the earlier one's delete began.
func (ev evidence) readGoneBefore(network string, lives []*incarnation, in *incarnation) bool {
	var prev *incarnation
	for _, l := range lives {
		if l.end != 0 && l.end <= in.created && (prev == nil || l.end > prev.end) {
			prev = l
		}
	}
	if prev == nil || prev.gap {
		return false
	}
	created, okc := ev.stored["create "+in.uid]
	deleted, okd := ev.stored["delete "+prev.uid]
	for _, r := range ev.reads {
		switch r.What {
		case "list":
			if r.Code == 200 && strings.HasPrefix(network, r.Network) && prev.end <= r.RV && r.RV < in.created {
				return true
			}
		case "get":
			if r.Code == 404 && r.Network == network && okc && okd && r.T.Before(created.Done) && r.Done.After(deleted.T) {
				return true
			}
		}
	}
	return false
}

func revision(rv uint64) string {
	if rv == 0 {
		return "no revision: it lives"
	}
	return fmt.Sprintf("revision %d", rv)
}

// liveAt is the incarnation alive at revision rv, if any.
func liveAt(lives []*incarnation, rv uint64) *incarnation {
	for _, in := range lives {
		if in.created < rv && (in.end == 0 || rv < in.end) {
			return in
		}
	}
	return nil
}

// checkBlocks holds RuleBlockShared over every identity written and every
// claim bound.
func checkBlocks(events []Event) []Violation {
	owner := map[uint32]string{}
	reported := map[uint32]bool{}
	var vs []Violation
	see := func(e Event, fid uint32, network, what string) {
		if fid == 0 || network == "" {
			return
		}
		prev, ok := owner[fid]
		switch {
		case !ok:
			owner[fid] = network
		case prev != network && !reported[fid]:
			reported[fid] = true
			vs = append(vs, Violation{e.T, RuleBlockShared,
				fmt.Sprintf("fabric ID %d (%s) is %s's and was given to %s too", fid, what, prev, network)})
		}
	}
	for _, e := range events {
		if e.Kind != KindObserve || e.What == "deleted" {
			continue
		}
		switch e.Object {
		case ObjectIdentity:
			see(e, e.FabricID, e.Network, "identity")
		case ObjectClaim:
			if e.Block == "" {
				continue
			}
			fid, err := hubctl.FabricIDFromBlock(e.Block)
			if err != nil {
				continue
			}
			see(e, fid, claimNetwork(e), "claim "+e.Claim+", block "+e.Block)
		}
	}
	return vs
}

// claimNetwork is the network a claim was made for: its annotations, else
// its name.
func claimNetwork(e Event) string {
	if e.Network != "" {
		return e.Network
	}
	if ns, name, ok := hubctl.NetworkOfClaim(e.Claim); ok {
		return ns + "/" + name
	}
	return ""
}

// CheckSettled returns the violations of a settled hub in s: a gone
// network holding a Retain claim, a live network without identity while a
// unit is free.
func CheckSettled(s Snapshot) []Violation {
	live := map[string]bool{}
	for _, n := range s.Networks {
		live[n] = true
	}
	var vs []Violation
	for _, c := range s.Claims {
		if !live[c.Network] && c.Policy == hubctl.PolicyRetain {
			vs = append(vs, Violation{Rule: RuleGoneHoldsClaim,
				Detail: fmt.Sprintf("gone network %s still holds claim %s (block %s, deleting %v)", c.Network, c.Name, c.Block, c.Deleting)})
		}
	}
	if s.QuotaUsed < s.QuotaLimit {
		for _, n := range s.Networks {
			if _, ok := s.Identities[n]; !ok {
				vs = append(vs, Violation{Rule: RuleWaitsWithUnitFree,
					Detail: fmt.Sprintf("live network %s has no identity while the quota holds %d of %d", n, s.QuotaUsed, s.QuotaLimit)})
			}
		}
	}
	return vs
}

// lastSnapshot is the history's last snapshot and when it was taken.
func lastSnapshot(events []Event) (*Snapshot, time.Time) {
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Kind == KindSnapshot && events[i].Snapshot != nil {
			return events[i].Snapshot, events[i].T
		}
	}
	return nil, time.Time{}
}
