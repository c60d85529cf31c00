package reclaim

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
)

// The brake's rules sit above the link layer and the inventory: these tests
// drive them with the package's fakes (fake_test.go). The real API server's
// accidents are integration/brake_test.go's.

// brakeOn is the brake as the daemon runs it by default, with no cap.
func brakeOn() Config {
	return Config{MassRemovalShare: DefaultMassRemovalShare, InventoryShrinkShare: DefaultInventoryShrinkShare, BrakeReleaseAfter: -1, MaxReclaimsPerPass: -1}
}

// staleIDs returns n identities of VPC 300 that no object carries.
func staleIDs(n int) []identity.Identity {
	ids := make([]identity.Identity, n)
	for i := range ids {
		ids[i] = identity.Identity{VPC: 300, Attachment: identity.Attachment(i + 1)}
	}
	return ids
}

// carriedInventory returns a healthy inventory that carries ids and, beside
// them, extra identities of other nodes.
func carriedInventory(ids []identity.Identity, extra int) *inventory.Static {
	var objs []inventory.Object
	for i, id := range ids {
		objs = append(objs, inventory.AttachmentObject("ns", fmt.Sprintf("att-%d", i), id.VPC.Base62(), id.Attachment.Base62()))
	}
	for i := range extra {
		objs = append(objs, inventory.AttachmentObject("elsewhere", fmt.Sprintf("att-%d", i), "9", identity.Attachment(i+1).Base62()))
	}
	return &inventory.Static{Objects: objs, Synced: true}
}

// Three of a node's four taps confirmed stale at once (a namespace deleted)
// is a mass removal: the pass removes nothing, says why, and keeps the
// candidates, until an operator allows it. Fails if the share rule is
// deleted.
func TestThreeOfFourTapsStaleAtOnceEngageTheBrake(t *testing.T) {
	h := newHarness(liveInventory(), brakeOn())
	var idx []uint32
	for _, id := range staleIDs(3) {
		idx = append(idx, h.links.addTap(id, "sandbox", 0, 0))
	}
	h.links.addTap(live, "sandbox-live", 0, 0)
	h.pass(t)
	for range 2 {
		rep := h.pass(t)
		if len(rep.Reclaimed) != 0 || rep.Brake == nil || !rep.Brake.Engaged || rep.Brake.Held != 3 {
			t.Fatalf("braked pass: reclaimed %v, brake %+v; want nothing removed, 3 held", rep.Reclaimed, rep.Brake)
		}
		if !strings.Contains(rep.Reason, "3 of the node's 4 stamped taps") {
			t.Errorf("reason %q does not say what engaged the brake", rep.Reason)
		}
	}
	if b := h.r.Brake(); !b.Engaged || b.Held != 3 || b.Since.IsZero() {
		t.Fatalf("Brake() = %+v, want engaged holding 3", b)
	}
	if p := h.r.Pending(); len(p) != 3 {
		t.Fatalf("pending while braked: %d, want the 3 candidates kept", len(p))
	}
	rep := h.r.Pass(context.Background(), PassOptions{AllowMassRemoval: true})
	if len(rep.Reclaimed) != 3 || rep.Brake == nil || rep.Brake.Released == "" {
		t.Fatalf("released pass: reclaimed %d, brake %+v; want all 3 and the release said", len(rep.Reclaimed), rep.Brake)
	}
	for _, i := range idx {
		if h.links.has(i) {
			t.Errorf("tap %d left after the release", i)
		}
	}
	if b := h.r.Brake(); b.Engaged || !strings.Contains(b.LastRelease, "operator") {
		t.Fatalf("Brake() after release = %+v", b)
	}
}

// Two stale taps are below the minimum however large their share: a node
// with one or two tenants loses them as it always did.
func TestTwoStaleTapsAreNoMassRemoval(t *testing.T) {
	h := newHarness(liveInventory(), brakeOn())
	for _, id := range staleIDs(2) {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	if rep := h.pass(t); len(rep.Reclaimed) != 2 || rep.Brake != nil {
		t.Fatalf("reclaimed %d, brake %+v; want both removed, no brake", len(rep.Reclaimed), rep.Brake)
	}
}

// Half of the stamped taps is not more than half.
func TestHalfOfTheTapsIsNoMassRemoval(t *testing.T) {
	ids := staleIDs(6)
	h := newHarness(carriedInventory(ids[3:], 0), brakeOn())
	for _, id := range ids {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	if rep := h.pass(t); len(rep.Reclaimed) != 3 || rep.Brake != nil {
		t.Fatalf("reclaimed %d, brake %+v; want 3 removed, no brake", len(rep.Reclaimed), rep.Brake)
	}
}

// A cluster whose carried identities fell from 60 to 10 (a CRD reinstalled,
// `delete --all` then one re-create elsewhere) engages the brake even when
// this node loses only one of its ten taps. Fails if the shrink rule is
// deleted.
func TestAShrunkInventoryEngagesTheBrake(t *testing.T) {
	ids := staleIDs(10)
	h := newHarness(carriedInventory(ids, 50), brakeOn())
	for _, id := range ids {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	h.inv = carriedInventory(ids[1:], 1) // 60 identities to 10; one tap stale
	h.pass(t)
	rep := h.pass(t)
	if len(rep.Reclaimed) != 0 || rep.Brake == nil || !rep.Brake.Engaged || !strings.Contains(rep.Brake.Reason, "fell from 60 to 10") {
		t.Fatalf("reclaimed %v, brake %+v; want nothing removed by the shrink rule", rep.Reclaimed, rep.Brake)
	}
}

// A steady inventory losing one identity is no shrink.
func TestOneIdentityGoneIsNoShrink(t *testing.T) {
	ids := staleIDs(10)
	h := newHarness(carriedInventory(ids, 0), brakeOn())
	for _, id := range ids {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	h.inv = carriedInventory(ids[1:], 0)
	h.pass(t)
	if rep := h.pass(t); len(rep.Reclaimed) != 1 || rep.Brake != nil {
		t.Fatalf("reclaimed %d, brake %+v; want the one stale tap removed", len(rep.Reclaimed), rep.Brake)
	}
}

// An engaged brake releases on its own once the inventory has shrunk no
// further for BrakeReleaseAfter; meanwhile it holds.
func TestTheBrakeReleasesOnceTheInventoryIsStable(t *testing.T) {
	cfg := brakeOn()
	cfg.BrakeReleaseAfter = 300 * time.Millisecond
	h := newHarness(liveInventory(), cfg)
	for _, id := range staleIDs(3) {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	rep := h.pass(t)
	if rep.Brake == nil || !rep.Brake.Engaged {
		t.Fatalf("brake %+v, want engaged", rep.Brake)
	}
	releasesAt := h.r.Brake().ReleasesAt
	if releasesAt.IsZero() {
		t.Fatal("an engaged brake with BrakeReleaseAfter says no release time")
	}
	if time.Now().Before(releasesAt) {
		if rep := h.pass(t); len(rep.Reclaimed) != 0 {
			t.Fatalf("removed %d before the release time", len(rep.Reclaimed))
		}
	}
	time.Sleep(time.Until(releasesAt))
	rep = h.pass(t)
	if len(rep.Reclaimed) != 3 || rep.Brake == nil || !strings.Contains(rep.Brake.Released, "on its own") {
		t.Fatalf("reclaimed %d, brake %+v; want the release on its own", len(rep.Reclaimed), rep.Brake)
	}
}

// What a release accepted goes at the cap's pace without engaging the brake
// again; a tap found stale after the release is weighed afresh.
func TestAReleaseAcceptsItsCandidatesOnly(t *testing.T) {
	cfg := brakeOn()
	cfg.MaxReclaimsPerPass = 1
	h := newHarness(liveInventory(), cfg)
	ids := staleIDs(7)
	for _, id := range ids[:4] {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	if rep := h.pass(t); rep.Brake == nil || !rep.Brake.Engaged {
		t.Fatalf("brake %+v, want engaged", rep.Brake)
	}
	rep := h.r.Pass(context.Background(), PassOptions{AllowMassRemoval: true})
	if len(rep.Reclaimed) != 1 || rep.RolledOver != 3 {
		t.Fatalf("released pass: reclaimed %d, rolled over %d; want the cap's 1 and 3 rolled over", len(rep.Reclaimed), rep.RolledOver)
	}
	for range 3 {
		if rep := h.pass(t); len(rep.Reclaimed) != 1 || rep.Brake != nil {
			t.Fatalf("accepted taps: reclaimed %d, brake %+v; want one a pass, no brake", len(rep.Reclaimed), rep.Brake)
		}
	}
	for _, id := range ids[4:] {
		h.links.addTap(id, "sandbox-new", 0, 0)
	}
	h.links.addTap(live, "sandbox-live", 0, 0)
	h.pass(t)
	if rep := h.pass(t); rep.Brake == nil || !rep.Brake.Engaged {
		t.Fatalf("3 of 4 new stale taps: brake %+v, want engaged again", rep.Brake)
	}
}

// A dry run with the operator's release previews it, what it would remove
// included, but never releases the brake.
func TestADryRunNeverReleasesTheBrake(t *testing.T) {
	h := newHarness(liveInventory(), brakeOn())
	for _, id := range staleIDs(3) {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	h.pass(t)
	rep := h.r.Pass(context.Background(), PassOptions{AllowMassRemoval: true, DryRun: true})
	if !h.r.Brake().Engaged || len(rep.Reclaimed) != 0 {
		t.Fatalf("dry run released the brake: %+v", h.r.Brake())
	}
	if rep.Brake == nil || rep.Brake.Released == "" || len(rep.WouldReclaim) != 3 ||
		!slices.ContainsFunc(rep.NotDone, func(s string) bool { return strings.HasPrefix(s, "the brake not released") }) {
		t.Fatalf("the dry run does not preview the release: brake %+v, would reclaim %v, not done %q", rep.Brake, rep.WouldReclaim, rep.NotDone)
	}
	if rep := h.pass(t); len(rep.Reclaimed) != 0 || rep.Brake == nil || !rep.Brake.Engaged {
		t.Fatalf("the real pass after the preview: reclaimed %v, brake %+v; want still held", rep.Reclaimed, rep.Brake)
	}
}

// Objects restored after an accident make every candidate carried again:
// the brake, with nothing left to hold, releases, and a later single stale
// tap is removed as usual.
func TestTheBrakeReleasesWhenTheObjectsComeBack(t *testing.T) {
	ids := staleIDs(4)
	h := newHarness(carriedInventory(ids, 0), brakeOn())
	for _, id := range ids {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	h.inv = carriedInventory(ids[:1], 0)
	h.pass(t)
	if rep := h.pass(t); rep.Brake == nil || !rep.Brake.Engaged {
		t.Fatalf("brake %+v, want engaged", rep.Brake)
	}
	h.inv = carriedInventory(ids, 0)
	if rep := h.pass(t); rep.Brake == nil || !strings.Contains(rep.Brake.Released, "no candidate left") || h.r.Brake().Engaged {
		t.Fatalf("objects back: brake %+v, state %+v; want released", rep.Brake, h.r.Brake())
	}
}

// In a small cluster (5 tenants, 3 of them gone), the departure of a few
// tenants does not hold a single removal: below LargeInventory the shrink
// rule weighs only a mass. A mass of the same departure is still held:
// 17 identities falling to 5 while 4 of the node's 8 taps go stale (half,
// so not the share rule) engages the brake. Fails if small inventories
// are not treated apart (the first), or if the shrink rule is deleted (the
// second).
func TestASmallClusterLosingAFewTenantsIsNoMass(t *testing.T) {
	ids := staleIDs(2)
	h := newHarness(carriedInventory(ids, 3), brakeOn())
	for _, id := range ids {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	h.inv = carriedInventory(ids[1:], 1) // 5 identities to 2; one tap stale
	h.pass(t)
	if rep := h.pass(t); len(rep.Reclaimed) != 1 || rep.Brake != nil {
		t.Fatalf("reclaimed %v, brake %+v; want the one stale tap removed", rep.Reclaimed, rep.Brake)
	}

	ids = staleIDs(8)
	h = newHarness(carriedInventory(ids, 9), brakeOn())
	for _, id := range ids {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	h.inv = carriedInventory(ids[4:], 1) // 17 identities to 5; 4 of 8 taps stale
	h.pass(t)
	rep := h.pass(t)
	if len(rep.Reclaimed) != 0 || rep.Brake == nil || !strings.Contains(rep.Brake.Reason, "fell from 17 to 5") {
		t.Fatalf("reclaimed %v, brake %+v; want the shrink rule to hold the mass", rep.Reclaimed, rep.Brake)
	}
}

// An operator's release on a pass where no rule fires still resets the
// inventory's peak: a shrink they judged ordinary holds no later removal.
// Fails if only an engaged brake's release resets the peak.
func TestAReleaseAlwaysResetsThePeak(t *testing.T) {
	ids := staleIDs(10)
	h := newHarness(carriedInventory(ids, 50), brakeOn())
	for _, id := range ids {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	h.inv = carriedInventory(ids, 1) // 60 to 11: tenants elsewhere left
	rep := h.r.Pass(context.Background(), PassOptions{AllowMassRemoval: true})
	if rep.Brake == nil || !strings.Contains(rep.Brake.Released, "peak was reset") {
		t.Fatalf("release with nothing held: brake %+v, want the peak reset", rep.Brake)
	}
	h.inv = carriedInventory(ids[1:], 1) // one of the node's taps goes stale
	h.pass(t)
	if rep := h.pass(t); len(rep.Reclaimed) != 1 || rep.Brake != nil {
		t.Fatalf("reclaimed %v, brake %+v; want the one stale tap removed", rep.Reclaimed, rep.Brake)
	}
}

// memoryStore is a BrakeMemoryStore in memory: the file itself is
// brakefile's, tested there and through the daemon's restart tests.
type memoryStore struct {
	saved []BrakeMemory
}

func (m *memoryStore) Save(b BrakeMemory) error { m.saved = append(m.saved, b); return nil }

func (m *memoryStore) last() BrakeMemory { return m.saved[len(m.saved)-1] }

// A reclaimer given the memory another one saved holds what that one held:
// the brake engaged by the shrink rule alone, with its reason and since,
// and the peak. Without RestoreBrake the second removes the four taps.
func TestARestoredBrakeStillHolds(t *testing.T) {
	ids := staleIDs(8)
	store := &memoryStore{}
	cfg := brakeOn()
	cfg.Memory = store
	h := newHarness(carriedInventory(ids, 52), cfg)
	for _, id := range ids {
		h.links.addTap(id, "sandbox", 0, 0)
	}
	h.pass(t)
	h.inv = carriedInventory(ids[4:], 1) // 60 to 5; 4 of 8 stale
	h.pass(t)
	if rep := h.pass(t); rep.Brake == nil || !rep.Brake.Engaged {
		t.Fatalf("brake %+v, want engaged", rep.Brake)
	}
	before := h.r.Brake()
	saves := len(store.saved)
	h.pass(t)
	if len(store.saved) != saves+1 {
		// the newest sample changes the memory each pass
		t.Logf("saves: %d then %d", saves, len(store.saved))
	}

	again := New(h.links, h.inv, h.reg, h.lock, nil, nil, brakeOffUnlessSet(cfg))
	again.RestoreBrake(store.last())
	if got := again.Brake(); !got.Engaged || got.Reason != before.Reason || !got.Since.Equal(before.Since) {
		t.Fatalf("restored brake %+v, want %+v", got, before)
	}
	for range 3 {
		if rep := again.Pass(context.Background(), PassOptions{}); len(rep.Reclaimed) != 0 {
			t.Fatalf("the restored reclaimer removed %v", rep.Reclaimed)
		}
	}
}

// A daemon that could not read the brake's memory starts with it engaged,
// saying why; an operator's release then works as for any engagement.
func TestABrakeEngagedAtStartHoldsUntilReleased(t *testing.T) {
	h := newHarness(liveInventory(), brakeOn())
	h.r.EngageBrake("the brake's memory could not be read")
	h.links.addTap(staleIDs(1)[0], "sandbox", 0, 0)
	h.pass(t)
	if rep := h.pass(t); len(rep.Reclaimed) != 0 || rep.Brake == nil || !rep.Brake.Engaged {
		t.Fatalf("reclaimed %v, brake %+v; want held", rep.Reclaimed, rep.Brake)
	}
	if rep := h.r.Pass(context.Background(), PassOptions{AllowMassRemoval: true}); len(rep.Reclaimed) != 1 {
		t.Fatalf("released: reclaimed %v", rep.Reclaimed)
	}
}

// A namespace's deletions reach the node over two passes (a slow watch, a
// delete that takes its objects in turn): the pass that confirms the first
// two of four taps finds the third stale for the first time. At that moment
// three of the node's four taps are stale, a mass: the brake must engage
// then, not let the pass take two and the next take the third. Fails if the
// share rule weighs only the confirmed taps.
func TestAMassSeenOverTwoPassesEngagesTheBrake(t *testing.T) {
	ids := staleIDs(3)
	h := newHarness(carriedInventory(append(ids[2:], live), 0), brakeOn())
	var idx []uint32
	for _, id := range ids {
		idx = append(idx, h.links.addTap(id, "sandbox", 0, 0))
	}
	h.links.addTap(live, "sandbox-live", 0, 0)
	h.pass(t) // the first two seen stale
	h.inv = liveInventory()
	for i := range 3 {
		rep := h.pass(t)
		if len(rep.Reclaimed) != 0 {
			t.Fatalf("pass %d removed %v: the brake let a mass go one part at a time", i+2, rep.Reclaimed)
		}
		if i > 0 && (rep.Brake == nil || !rep.Brake.Engaged) {
			t.Fatalf("pass %d: brake %+v, want engaged", i+2, rep.Brake)
		}
	}
	for _, ix := range idx {
		if !h.links.has(ix) {
			t.Errorf("tap %d removed while three of four were stale", ix)
		}
	}
}

// The cache the passes read can lag the API server: a pass confirms two of
// four taps from it while the consistent read made before any removal shows
// a third gone too. The brake weighs what that read shows, the stronger
// answer, before a tap goes. Fails if the brake weighs the cache alone.
func TestAMassOnlyTheProofShowsEngagesTheBrake(t *testing.T) {
	ids := staleIDs(3)
	inv := &proverInventory{cache: carriedInventory(append(ids[2:], live), 0), origin: carriedInventory(append(ids[2:], live), 0)}
	h := newHarness(inv, brakeOn())
	var idx []uint32
	for _, id := range ids {
		idx = append(idx, h.links.addTap(id, "sandbox", 0, 0))
	}
	h.links.addTap(live, "sandbox-live", 0, 0)
	h.pass(t) // the first two seen stale
	inv.origin = liveInventory()
	rep := h.pass(t)
	if len(rep.Reclaimed) != 0 || rep.Brake == nil || !rep.Brake.Engaged {
		t.Fatalf("reclaimed %v, brake %+v: want nothing removed, the brake engaged", rep.Reclaimed, rep.Brake)
	}
	if !strings.Contains(rep.Reason, "3 of the node's 4 stamped taps") {
		t.Errorf("reason %q does not count the tap only the proof shows stale", rep.Reason)
	}
	for _, ix := range idx {
		if !h.links.has(ix) {
			t.Errorf("tap %d removed", ix)
		}
	}
}
