package reclaim

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/inventory"
)

// A dry run answers "what would a real pass do now" and leaves nothing a
// later pass decides by: each test here fails when a dry run records
// something (a sighting, a forgotten candidate, the brake, a peak sample,
// the proof) or stops saying what it did not do.

func dryRun(h *harness) Report {
	return h.r.Pass(context.Background(), PassOptions{DryRun: true})
}

func notDoneSays(rep Report, want string) bool {
	return slices.ContainsFunc(rep.NotDone, func(s string) bool { return strings.Contains(s, want) })
}

// The case: a tap seen first by a dry run is not removed by the
// next real pass, which only marks it, as it would have with no preview.
func TestADryRunRecordsNoSighting(t *testing.T) {
	h := newHarness(liveInventory(), Config{})
	idx := h.links.addTap(stale, "sandbox-2", 0, 0)
	for range 2 {
		rep := dryRun(h)
		if len(rep.Candidates) != 1 || rep.Candidates[0].Passes != 1 || len(rep.WouldReclaim) != 0 {
			t.Fatalf("a dry run must see the tap for the first time each time: %+v", rep)
		}
		if !notDoneSays(rep, "1 seen once: a real pass now would start their confirmation") {
			t.Fatalf("the dry run does not say what it did not record: %q", rep.NotDone)
		}
	}
	if p := h.r.Pending(); len(p) != 0 {
		t.Fatalf("dry runs left %d candidates pending", len(p))
	}
	if rep := h.pass(t); !h.links.has(idx) || len(rep.Reclaimed) != 0 || rep.Candidates[0].Passes != 1 {
		t.Fatalf("the real pass after dry runs removed the tap, or counted their sightings: %+v", rep)
	}
	rep := dryRun(h)
	if !h.links.has(idx) || len(rep.WouldReclaim) != 1 || !notDoneSays(rep, "a real pass now would remove 1") {
		t.Fatalf("a dry run after a sighting must preview the removal: %+v", rep)
	}
	if p := h.r.Pending(); len(p) != 1 || p[0].Passes != 1 {
		t.Fatalf("the dry run moved the candidate on: %+v", p)
	}
	if rep := h.pass(t); h.links.has(idx) || len(rep.Reclaimed) != 1 {
		t.Fatalf("the second real pass: %+v", rep)
	}
}

// A real pass on an untrustworthy inventory forgets every candidate; a dry
// run on one forgets none, and says a real pass would have.
func TestADryRunForgetsNothing(t *testing.T) {
	h := newHarness(liveInventory(), Config{})
	idx := h.links.addTap(stale, "sandbox-2", 0, 0)
	h.pass(t)
	h.inv = &inventory.Static{Objects: liveInventory().Objects, Synced: false}
	rep := dryRun(h)
	if rep.Result != ResultSkipped || !notDoneSays(rep, "1 pending not forgotten") {
		t.Fatalf("a dry run on an unsynced inventory: %+v", rep)
	}
	if p := h.r.Pending(); len(p) != 1 {
		t.Fatalf("the dry run forgot the candidate: %d pending", len(p))
	}
	h.inv = liveInventory()
	if rep := h.pass(t); h.links.has(idx) || len(rep.Reclaimed) != 1 {
		t.Fatalf("the real pass decides as if the dry run had not run, and removes: %+v", rep)
	}
}

// A dry run runs the brake's rules for its report, engaging it there, and
// leaves the brake, its peak samples and its saved memory as they were.
func TestADryRunLeavesTheBrakeAsItWas(t *testing.T) {
	store := &memoryStore{}
	cfg := brakeOn()
	cfg.Memory = store
	h := newHarness(liveInventory(), cfg)
	for _, id := range staleIDs(3) {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.links.addTap(live, "sandbox-live", 0, 0)
	h.pass(t)
	before, saves := h.r.brake.memory(), len(store.saved)

	rep := dryRun(h)
	if rep.Brake == nil || !rep.Brake.Engaged || rep.Brake.Held != 3 || len(rep.Held) != 3 {
		t.Fatalf("the dry run's report must preview the brake engaging on 3: %+v %+v", rep.Brake, rep.Held)
	}
	if !notDoneSays(rep, "the brake not engaged: a real pass now would engage it, holding 3") {
		t.Fatalf("the dry run does not say it did not engage the brake: %q", rep.NotDone)
	}
	if b := h.r.Brake(); b.Engaged {
		t.Fatalf("a dry run engaged the brake: %+v", b)
	}
	if got := h.r.brake.memory(); !reflect.DeepEqual(got, before) {
		t.Fatalf("a dry run changed the brake's memory (its peak samples):\n got %+v\nwant %+v", got, before)
	}
	if len(store.saved) != saves {
		t.Fatalf("a dry run saved the brake's memory: %d saves, want %d", len(store.saved), saves)
	}
	if rep := h.pass(t); rep.Brake == nil || !rep.Brake.Engaged {
		t.Fatalf("the real pass after the dry run: brake %+v, want engaged", rep.Brake)
	}
}

// After a failed proof, a real pass that proves the inventory again clears
// the failure; a dry run that does leaves it, so the next real pass proves
// again before it marks.
func TestADryRunLeavesAFailedProof(t *testing.T) {
	inv := &proverInventory{cache: liveInventory(), origin: liveInventory()}
	h := newHarness(inv, Config{})
	h.links.addTap(stale, "sandbox-2", 0, 0)
	h.pass(t)
	inv.proveErr = errInjected
	if rep := h.pass(t); rep.Result != ResultSkipped {
		t.Fatalf("a failed proof: %+v", rep)
	}
	inv.proveErr = nil
	dryRun(h)
	if h.r.unproven == nil {
		t.Fatal("a dry run cleared the failed proof")
	}
	proofs := inv.proofs
	h.pass(t)
	if inv.proofs == proofs || h.r.unproven != nil {
		t.Fatalf("the real pass did not prove the inventory again itself (%d proofs before, %d after)", proofs, inv.proofs)
	}
}

// A braked pass confirmed every tap it held: it lists them as confirmed
// and as held, and its brake holds as many. Removal counts do not move.
func TestABrakedPassListsWhatItHeldAsConfirmed(t *testing.T) {
	h := newHarness(liveInventory(), brakeOn())
	for _, id := range staleIDs(3) {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.links.addTap(live, "sandbox-live", 0, 0)
	h.pass(t)
	for range 2 {
		rep := h.pass(t)
		if rep.Brake == nil || !rep.Brake.Engaged || rep.Brake.Held != 3 {
			t.Fatalf("brake %+v, want engaged holding 3", rep.Brake)
		}
		if len(rep.Confirmed) != 3 || !slices.Equal(rep.Held, rep.Confirmed) || len(rep.Reclaimed) != 0 || len(rep.WouldReclaim) != 0 {
			t.Fatalf("a braked pass holding 3: confirmed %v, held %v, reclaimed %v; want the 3 confirmed and held, none reclaimed",
				rep.Confirmed, rep.Held, rep.Reclaimed)
		}
		if !slices.IsSortedFunc(rep.Confirmed, func(a, b TapRef) int { return int(a.Ifindex) - int(b.Ifindex) }) {
			t.Errorf("confirmed not in ifindex order: %v", rep.Confirmed)
		}
	}
	// An unbraked pass holds nothing.
	rep := h.r.Pass(context.Background(), PassOptions{AllowMassRemoval: true})
	if len(rep.Reclaimed) != 3 || len(rep.Confirmed) != 3 || len(rep.Held) != 0 {
		t.Fatalf("the released pass: confirmed %v, held %v, reclaimed %v", rep.Confirmed, rep.Held, rep.Reclaimed)
	}
}

// An orphan seen first by a dry run is seen first again by the next real
// pass, which clears nothing.
func TestADryRunRecordsNoOrphanSighting(t *testing.T) {
	h := newHarness(liveInventory(), Config{})
	reg := &listingRegistry{fakeRegistry: h.reg, regs: []attachreg.Registered{
		{Ifindex: 900, Identity: stale, Rows: map[string]int{"ifindex_vrf": 1}, Pinned: true},
	}}
	h.r.useRegistry(reg)
	rep := dryRun(h)
	if len(rep.Orphans) != 1 || !notDoneSays(rep, "1 orphaned interfaces seen once") {
		t.Fatalf("a dry run must report the orphan and say it recorded no sighting: %+v", rep)
	}
	if rep := h.pass(t); len(rep.OrphansCleared) != 0 || len(h.reg.unregistered) != 0 || rep.Orphans[0].Passes != 1 {
		t.Fatalf("the real pass after a dry run cleared the orphan, or counted its sighting: %+v, unregistered %v", rep, h.reg.unregistered)
	}
	if rep := dryRun(h); len(rep.OrphansWouldClear) != 1 || len(h.reg.unregistered) != 0 {
		t.Fatalf("a dry run after a sighting must preview the clearing: %+v", rep)
	}
	if rep := h.pass(t); len(rep.OrphansCleared) != 1 {
		t.Fatalf("the second real pass: %+v", rep)
	}
}

// A daemon in dry-run has no real pass to protect: its passes track
// candidates as real ones would, so that a rollout in dry-run shows what
// the node would remove, and they are no previews.
func TestADaemonInDryRunStillTracksCandidates(t *testing.T) {
	h := newHarness(liveInventory(), Config{DryRun: true})
	idx := h.links.addTap(stale, "sandbox-2", 0, 0)
	h.pass(t)
	rep := h.pass(t)
	if !h.links.has(idx) || len(rep.WouldReclaim) != 1 || rep.Preview || len(rep.NotDone) != 0 {
		t.Fatalf("the second pass of a daemon in dry-run: %+v", rep)
	}
	if p := h.r.Pending(); len(p) != 1 || p[0].Passes != 2 {
		t.Fatalf("pending in a daemon in dry-run: %+v", p)
	}
}
