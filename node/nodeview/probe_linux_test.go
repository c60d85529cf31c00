package nodeview_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/nodeview"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/node/vrf"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// noRows is a registry with no eBPF rows to clear.
type noRows struct{}

func (noRows) UnregisterInterface(context.Context, uint32) error { return nil }

// countingProber is the kernel prober, recording the taps it was asked
// about.
type countingProber struct {
	holder.Prober
	mu     sync.Mutex
	probed []string
}

func (p *countingProber) Claim(ctx context.Context, t link.Tap) (*holder.Claim, error) {
	p.mu.Lock()
	p.probed = append(p.probed, t.Name)
	p.mu.Unlock()
	return p.Prober.Claim(ctx, t)
}

// probeScene is a namespace of stamped single-queue taps with carrier off,
// an inventory and a reclaimer over them, and no holder scan: what the view
// sees when /proc misses a VMM.
type probeScene struct {
	ns   *nettest.NS
	conn *link.Conn
	inv  *inventory.Static
	r    *reclaim.Reclaimer
}

func newProbeScene(t *testing.T) *probeScene {
	ns := nettest.NewNS(t)
	conn := ns.Dial(t)
	locks, err := vrf.NewLocker(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &probeScene{ns: ns, conn: conn, inv: &inventory.Static{Synced: true}}
	// No pass may confirm a candidate within the test: it only marks.
	s.r = reclaim.New(conn, s.inv, noRows{}, locks, nil, nil, reclaim.Config{MinCandidateAge: time.Hour, Prober: s.prober()})
	return s
}

func (s *probeScene) prober() holder.Prober { return holder.Prober{NS: s.ns.File, Links: s.conn} }

// tap makes a stamped single-queue tap of id with its carrier off, held by
// another process when held; the holder forces carrier off as a VMM may.
func (s *probeScene) tap(t *testing.T, id identity.Identity, held bool) string {
	t.Helper()
	name := id.TapName()
	nettest.NewTap(t, s.ns, name, tun.Mode{SingleQueue: true})
	s.ns.IP(t, "link", "set", name, "alias", "sandbox-"+id.Attachment.Base62())
	if held {
		nettest.HoldInFlight(t, s.ns, name, tun.Mode{SingleQueue: true})
		s.ns.IP(t, "link", "set", "dev", name, "carrier", "off")
	}
	return name
}

func (s *probeScene) taps(t *testing.T, v *nodeview.Views) map[string]nodeview.TapView {
	t.Helper()
	views, err := v.Taps(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]nodeview.TapView{}
	for _, tv := range views {
		byName[tv.Name] = tv
	}
	return byName
}

// A single-queue tap held by a file no scan sees, with its carrier forced
// off and its identity carried by nothing, is a candidate of the reclaim
// after a pass; the view asks the kernel as the pass's probe would and
// reads it held. A free tap of the same kind still reads a candidate, and
// the view's probe leaves it free for a VMM to open. A tap the inventory
// carries is never probed, even when held.
func TestTapsAsksTheKernelOfASingleQueueTapWithCarrierOff(t *testing.T) {
	s := newProbeScene(t)
	heldTap := s.tap(t, identity.Identity{VPC: 62, Attachment: 1}, true)
	freeTap := s.tap(t, identity.Identity{VPC: 62, Attachment: 2}, false)
	liveID := identity.Identity{VPC: 62, Attachment: 3}
	liveTap := s.tap(t, liveID, true)
	s.inv.Objects = []inventory.Object{inventory.AttachmentObject("tenant", "vm-3", liveID.VPC.Base62(), liveID.Attachment.Base62())}

	rep := s.r.Pass(context.Background(), reclaim.PassOptions{})
	if len(rep.Candidates) != 2 {
		t.Fatalf("the pass marked %d candidates, want the held and the free tap: %+v", len(rep.Candidates), rep)
	}
	p := &countingProber{Prober: s.prober()}
	taps := s.taps(t, &nodeview.Views{Links: s.conn, Inventory: s.inv, Reclaimer: s.r, Prober: p})

	if v := taps[heldTap]; !v.Held || v.State != nodeview.StateHeld || !strings.Contains(v.HeldWhy, "EBUSY") {
		t.Errorf("held tap: held=%v state=%s heldWhy=%q, want held=true state=held, the kernel's refusal", v.Held, v.State, v.HeldWhy)
	}
	if v := taps[freeTap]; v.Held || v.State != nodeview.StateCandidate {
		t.Errorf("free tap: held=%v state=%s heldWhy=%q, want held=false state=candidate", v.Held, v.State, v.HeldWhy)
	}
	if v := taps[liveTap]; v.Held || v.State != nodeview.StateLive || !strings.Contains(v.HeldWhy, "not asked") {
		t.Errorf("carried tap: held=%v state=%s heldWhy=%q, want held=false state=live, not asked", v.Held, v.State, v.HeldWhy)
	}
	for _, name := range p.probed {
		if name == liveTap {
			t.Errorf("the carried tap %s was probed", liveTap)
		}
	}
	// The probe released the free tap at once: a VMM opening it now gets
	// it.
	if _, err := nettest.TryHold(t, s.ns, freeTap, nettest.HoldOptions{Mode: tun.Mode{SingleQueue: true}}); err != nil {
		t.Errorf("the view's probe left the free tap held: %v", err)
	}
}

// Without a prober the view does not call a held tap free: it says it did
// not ask.
func TestTapsSaysWhenItDidNotAskTheKernel(t *testing.T) {
	s := newProbeScene(t)
	heldTap := s.tap(t, identity.Identity{VPC: 62, Attachment: 1}, true)
	s.r.Pass(context.Background(), reclaim.PassOptions{})
	v := s.taps(t, &nodeview.Views{Links: s.conn, Inventory: s.inv, Reclaimer: s.r})[heldTap]
	if v.Held || !strings.Contains(v.HeldWhy, "not asked") {
		t.Errorf("held tap with no prober: held=%v heldWhy=%q, want not held and not asked", v.Held, v.HeldWhy)
	}
}

// One view probes at most MaxProbesPerView taps; the others say the budget
// kept them unasked.
func TestTapsProbesWithinABudget(t *testing.T) {
	s := newProbeScene(t)
	n := nodeview.MaxProbesPerView + 2
	for i := range n {
		s.tap(t, identity.Identity{VPC: 62, Attachment: identity.Attachment(10 + i)}, false)
	}
	p := &countingProber{Prober: s.prober()}
	taps := s.taps(t, &nodeview.Views{Links: s.conn, Inventory: s.inv, Reclaimer: s.r, Prober: p})
	if len(p.probed) != nodeview.MaxProbesPerView {
		t.Errorf("probed %d taps, want %d", len(p.probed), nodeview.MaxProbesPerView)
	}
	budget := 0
	for _, v := range taps {
		if strings.Contains(v.HeldWhy, "not asked: probe budget") {
			budget++
		}
	}
	if budget != n-nodeview.MaxProbesPerView {
		t.Errorf("%d taps say the probe budget kept them unasked, want %d", budget, n-nodeview.MaxProbesPerView)
	}
}
