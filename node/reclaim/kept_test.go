package reclaim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// holdAt wraps the real link layer and makes a VMM open one tap at one point
// of the removal: a test seam, since the race it stands for (a VMM opening
// the tap between two checks) cannot be timed from outside.
type holdAt struct {
	*faultLinks
	t     *testing.T
	ns    *nettest.NS
	point string // "verify", "set" or "dump"
	name  string // the tap to hold
	armed bool   // set after the pass that only marks

	once sync.Once
}

func (h *holdAt) hold() {
	if !h.armed {
		return
	}
	h.once.Do(func() { nettest.Hold(h.t, h.ns, h.name, nettest.HoldOptions{}) })
}

// Verify holds the tap after the recheck read it free.
func (h *holdAt) Verify(ctx context.Context, want link.Expect) (link.Link, error) {
	l, err := h.faultLinks.Verify(ctx, want)
	if h.point == "verify" && want.Name == h.name {
		h.hold()
	}
	return l, err
}

// Set holds the tap once it is moved into the batch's link group.
func (h *holdAt) Set(ctx context.Context, index uint32, ch link.Change) error {
	err := h.faultLinks.Set(ctx, index, ch)
	if h.point == "set" && ch.Group != nil && *ch.Group != 0 {
		if l, gerr := h.Get(ctx, index); gerr == nil && l.Name == h.name {
			h.hold()
		}
	}
	return err
}

// Links holds the tap just before the dump that checks the group: the first
// dump that finds it grouped.
func (h *holdAt) Links(ctx context.Context) ([]link.Link, error) {
	links, err := h.faultLinks.Links(ctx)
	if h.point != "dump" || err != nil {
		return links, err
	}
	for _, l := range links {
		if l.Name == h.name && l.Group != 0 {
			h.hold()
			return h.faultLinks.Links(ctx)
		}
	}
	return links, nil
}

// recheckHolder makes the VMM open the tap while the reclaim takes its fresh
// inventory snapshot, the check after the links were read again.
type recheckHolder struct {
	inventory.Source
	calls int
	hold  func()
}

func (r *recheckHolder) Snapshot(ctx context.Context) inventory.Snapshot {
	r.calls++
	if r.calls == 3 { // the fresh snapshot of the second pass
		r.hold()
	}
	return r.Source.Snapshot(ctx)
}

// rowsJSON is every row and the attachment of ifindex, as one comparable text.
func (s *scene) rowsJSON(ifindex uint32) string {
	s.t.Helper()
	rows, err := s.reg.Rows(ifindex)
	if err != nil {
		s.t.Fatal(err)
	}
	// The program is the link's, which goes with its device, not a row.
	rows.Program = nil
	b, err := json.Marshal(rows)
	if err != nil {
		s.t.Fatal(err)
	}
	return string(b)
}

// TestATapHeldAtAnyCheckKeepsItsRowsAndProgram makes one tap of a batch held
// at each point between the first recheck and the group delete: after the
// recheck read it, during the inventory recheck, after it joined the link
// group, and just before the group is checked. It must be kept with exactly
// the rows and attachment it had, and the rest of the batch removed.
func TestATapHeldAtAnyCheckKeepsItsRowsAndProgram(t *testing.T) {
	for _, tc := range []struct {
		point string
		batch int
	}{{"verify", 8}, {"recheck", 8}, {"set", 8}, {"dump", 8}, {"set", 200}} {
		t.Run(fmt.Sprintf("%s/batch %d", tc.point, tc.batch), func(t *testing.T) {
			live := identity.Identity{VPC: 62, Attachment: 1}
			static := &inventory.Static{Synced: true, Objects: []inventory.Object{
				inventory.AttachmentObject("tenant-a", "live", live.VPC.Base62(), live.Attachment.Base62()),
			}}
			rh := &recheckHolder{Source: static}
			s := newScene(t, nil, rh)
			var taps []link.Tap
			for i := range tc.batch {
				taps = append(taps, s.addTap(staleID(i), fmt.Sprintf("sandbox-%d", i)))
			}
			victim := taps[tc.batch/2]
			before := s.rowsJSON(victim.Index)
			h := &holdAt{faultLinks: s.links, t: t, ns: s.ns, point: tc.point, name: victim.Name}
			rh.hold = func() {
				if tc.point == "recheck" {
					h.hold()
				}
			}
			s.r = reclaimOver(s, h)

			if rep := s.pass(); len(rep.Candidates) != tc.batch {
				t.Fatalf("pass 1: %d candidates, want %d", len(rep.Candidates), tc.batch)
			}
			h.armed = true
			rep := s.pass()
			if !s.exists(victim) {
				t.Fatalf("the tap held at %s was removed: %+v", tc.point, rep)
			}
			if len(rep.Reclaimed) != tc.batch-1 || len(rep.Kept) != 1 {
				t.Fatalf("pass 2 reclaimed %d, kept %+v; want %d and the held tap", len(rep.Reclaimed), rep.Kept, tc.batch-1)
			}
			if after := s.rowsJSON(victim.Index); after != before {
				t.Fatalf("the kept tap's rows changed:\nbefore %s\nafter  %s", before, after)
			}
			if l, _ := s.conn.Get(context.Background(), victim.Index); l.Group != 0 {
				t.Fatalf("the kept tap was left in link group %#x", l.Group)
			}
			for _, tp := range taps {
				if tp.Index != victim.Index && s.rowsOf(tp.Index) != 0 {
					t.Fatalf("the removed tap %s left rows", tp.Name)
				}
			}
		})
	}
}

// TestTheKernelProbeDecidesASingleQueueTap: tun reports no queue counts for
// a single-queue tap and accepts carrier off while a VMM holds it, so only
// the kernel's answer to an attach tells a held one from a free one. A held
// one with carrier forced off stays with its rows; a free one goes; with no
// probe, every single-queue tap stays.
func TestTheKernelProbeDecidesASingleQueueTap(t *testing.T) {
	live := identity.Identity{VPC: 62, Attachment: 1}
	static := &inventory.Static{Synced: true, Objects: []inventory.Object{
		inventory.AttachmentObject("tenant-a", "live", live.VPC.Base62(), live.Attachment.Base62()),
	}}
	s := newScene(t, nil, static)
	held := s.addTapMode(staleID(1), "sandbox-held", true)
	free := s.addTapMode(staleID(2), "sandbox-free", true)
	nettest.Hold(t, s.ns, held.Name, nettest.HoldOptions{Mode: tun.Mode{SingleQueue: true}})
	s.ns.IP(t, "link", "set", held.Name, "carrier", "off")
	if l, err := s.conn.Get(context.Background(), held.Index); err != nil || l.Carrier == nil || *l.Carrier {
		t.Fatalf("scene: carrier of the held tap %v (%v), want off", l.Carrier, err)
	}
	before := s.rowsJSON(held.Index)

	blind := reclaim.New(s.links, s.inv, s.reg, s.locks, nil, nil, reclaim.BrakeOffUnlessSet(reclaim.Config{}))
	for range 3 {
		rep := blind.Pass(context.Background(), reclaim.PassOptions{})
		if !s.exists(held) || !s.exists(free) || len(rep.Reclaimed) != 0 {
			t.Fatalf("a reclaimer with no kernel probe removed a single-queue tap: %+v", rep)
		}
	}
	s.pass()
	rep := s.pass()
	if !s.exists(held) || s.rowsJSON(held.Index) != before {
		t.Fatalf("the held single-queue tap with carrier off was removed or lost rows: %+v", rep)
	}
	if len(rep.Kept) != 1 || !strings.Contains(rep.Kept[0].Why, "EBUSY") {
		t.Fatalf("the report does not say the kernel refused the probe: %+v", rep.Kept)
	}
	if s.exists(free) || len(rep.Reclaimed) != 1 || rep.Reclaimed[0].Name != free.Name || s.rowsOf(free.Index) != 0 {
		t.Fatalf("the free single-queue tap: %+v", rep)
	}
}

// attachBeforeDelete is a VMM that opens each target by name just before
// the delete request: a test seam, since the window between the last check
// and the delete cannot be timed from outside.
type attachBeforeDelete struct {
	*faultLinks
	ns    *nettest.NS
	names []string
	mu    sync.Mutex
	tried map[string]error
}

func (a *attachBeforeDelete) attach() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, name := range a.names {
		f, err := tun.Open(a.ns.File, name, tun.Mode{SingleQueue: true})
		if err == nil {
			f.Close()
		}
		a.tried[name] = err
	}
}

func (a *attachBeforeDelete) DeleteVerified(ctx context.Context, want link.Expect) error {
	a.attach()
	return a.faultLinks.DeleteVerified(ctx, want)
}

func (a *attachBeforeDelete) DeleteGroup(ctx context.Context, group uint32) error {
	a.attach()
	return a.faultLinks.DeleteGroup(ctx, group)
}

// TestAVMMCannotAttachBetweenTheProbeAndTheDelete: the probe's file stays
// attached to a single-queue tap until its link is gone, so a VMM's
// TUNSETIFF in that window fails with EBUSY, alone or in a batch.
func TestAVMMCannotAttachBetweenTheProbeAndTheDelete(t *testing.T) {
	for _, batch := range []int{1, 3} {
		t.Run(fmt.Sprintf("batch %d", batch), func(t *testing.T) {
			live := identity.Identity{VPC: 62, Attachment: 1}
			s := newScene(t, nil, &inventory.Static{Synced: true, Objects: []inventory.Object{
				inventory.AttachmentObject("tenant-a", "live", live.VPC.Base62(), live.Attachment.Base62()),
			}})
			vmm := &attachBeforeDelete{faultLinks: s.links, ns: s.ns, tried: map[string]error{}}
			var taps []link.Tap
			for i := range batch {
				tp := s.addTapMode(staleID(i), fmt.Sprintf("sandbox-%d", i), true)
				taps = append(taps, tp)
				vmm.names = append(vmm.names, tp.Name)
			}
			s.r = reclaimOver(s, vmm)
			s.pass()
			rep := s.pass()
			if len(rep.Reclaimed) != batch {
				t.Fatalf("pass 2 reclaimed %d of %d: %+v", len(rep.Reclaimed), batch, rep)
			}
			for _, tp := range taps {
				if err := vmm.tried[tp.Name]; !errors.Is(err, unix.EBUSY) {
					t.Fatalf("a VMM's TUNSETIFF on %s just before the delete: %v, want EBUSY", tp.Name, err)
				}
				if s.exists(tp) {
					t.Fatalf("%s was not removed", tp.Name)
				}
			}
		})
	}
}
