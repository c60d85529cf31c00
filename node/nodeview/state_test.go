package nodeview

import (
	"testing"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// Each state, and the precedence between them: a tap is the most protected
// state any of its facts allows, and a pending entry counts only for the
// very tap it was taken of.
func TestTapState(t *testing.T) {
	id := identity.Identity{VPC: 62, Attachment: 65}
	tap := link.Tap{Link: link.Link{Index: 7, Name: "G000000010013H", Alias: "sandbox-1"}, Identity: id}
	unstamped := tap
	unstamped.Alias = ""
	ref := reclaim.TapRef{Name: tap.Name, Ifindex: tap.Index, Owner: tap.Owner(), Identity: id}
	candidate := &reclaim.Pending{Tap: ref, Passes: 1}
	confirmed := &reclaim.Pending{Tap: ref, Passes: 2}
	otherName, otherOwner := *confirmed, *confirmed
	otherName.Tap.Name = "G000000010014H"
	otherOwner.Tap.Owner = "sandbox-2"

	for _, c := range []struct {
		name    string
		tap     link.Tap
		held    bool
		live    bool
		pending *reclaim.Pending
		want    TapState
	}{
		{"stale", tap, false, false, nil, StateStale},
		{"candidate", tap, false, false, candidate, StateCandidate},
		{"confirmed", tap, false, false, confirmed, StateConfirmed},
		{"unstamped", unstamped, false, false, nil, StateUnstamped},
		{"live", tap, false, true, nil, StateLive},
		{"held", tap, true, false, nil, StateHeld},

		{"held beats live", tap, true, true, confirmed, StateHeld},
		{"held beats unstamped", unstamped, true, false, nil, StateHeld},
		{"live beats unstamped", unstamped, false, true, nil, StateLive},
		{"live beats confirmed", tap, false, true, confirmed, StateLive},
		{"unstamped beats confirmed", unstamped, false, false, &reclaim.Pending{Tap: reclaim.TapRef{Name: tap.Name, Ifindex: tap.Index}, Passes: 2}, StateUnstamped},
		{"confirmed beats candidate", tap, false, false, &reclaim.Pending{Tap: ref, Passes: 3}, StateConfirmed},

		{"pending for another name at the ifindex", tap, false, false, &otherName, StateStale},
		{"pending for another owner at the ifindex", tap, false, false, &otherOwner, StateStale},
	} {
		if got := tapState(c.tap, c.held, c.live, c.pending); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
}
