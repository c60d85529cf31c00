package reclaim_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/chaostest"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// tapModel is what the chaos believes of one tap.
type tapModel struct {
	tap         link.Tap
	singleQueue bool
	holder      *nettest.Holder
	rows        string    // its rows and attachment when made: a survivor keeps them
	staleRuns   int       // consecutive healthy, fault-free passes that saw it stale
	firstStale  time.Time // when the first of those passes ended
}

// midBatchLinks is the real link layer, through the scene's fault seam,
// with a VMM that may open a tap the moment it joins a removal's link group:
// the race between the recheck and the group delete, timed on purpose.
type midBatchLinks struct {
	*faultLinks
	onGrouped func(index uint32)
}

func (m *midBatchLinks) Set(ctx context.Context, index uint32, ch link.Change) error {
	err := m.faultLinks.Set(ctx, index, ch)
	if err == nil && ch.Group != nil && *ch.Group != 0 {
		m.onGrouped(index)
	}
	return err
}

// nodeChaos runs ops random operations against real taps in a netns and a
// real API server (its own: it stops and starts it), with a reclaim pass
// every few operations, at random gaps around the minimum candidate age.
// Taps are multiqueue or single-queue, their carriers forced on and off, and
// a VMM may open a tap the moment it joins a removal's link group. After
// every pass it checks: no tap that was held or whose identity an object
// carried during the pass was removed; every tap that survived has the rows
// and attachment it was made with (rows of a live interface are never
// removed); every tap stale for two healthy, fault-free passes at least the
// minimum age apart is gone; and the rows and pin of a tap deleted behind
// the node's back are gone after two healthy, fault-free passes. It returns the
// first violation. breakIt, if set, breaks the reclaimer first.
func nodeChaos(t *testing.T, seed uint64, ops int, breakIt func(*reclaim.Reclaimer)) error {
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	cluster := clustertest.Start(t)
	t.Cleanup(func() { _ = cluster.Env.Stop() })
	s := newScene(t, cluster, nil)
	// Candidates must be 20 ms old: passes come at random gaps around it.
	const minAge = 20 * time.Millisecond
	taps := map[identity.Identity]*tapModel{}
	mid := &midBatchLinks{faultLinks: s.links, onGrouped: func(index uint32) {
		for _, m := range taps {
			if m.tap.Index == index && m.holder == nil && rng.IntN(8) == 0 {
				// A single-queue tap is claimed by the removal's probe
				// by now: the kernel refuses the VMM (EBUSY), which
				// then holds nothing, as a real one would fail to start.
				h, err := nettest.TryHold(t, s.ns, m.tap.Name, nettest.HoldOptions{Mode: tun.Mode{SingleQueue: m.singleQueue}})
				switch {
				case err == nil:
					m.holder = h
				case !m.singleQueue || !errors.Is(err, unix.EBUSY):
					t.Fatal(err)
				}
			}
		}
	}}
	s.r = reclaimWith(s, mid, reclaim.Config{MinCandidateAge: minAge})
	if breakIt != nil {
		breakIt(s.r)
	}
	ctx := context.Background()
	ids := make([]identity.Identity, 0, 32)
	for v := range 4 {
		for a := range 8 {
			ids = append(ids, identity.Identity{VPC: identity.VPC(70 + v), Attachment: identity.Attachment(a + 1)})
		}
	}
	orphans := map[uint32]int{}                // ifindex of a tap deleted behind the node's back: healthy passes since
	attached := map[identity.Identity]bool{}   // a VPCAttachment carries it
	advertised := map[identity.Identity]bool{} // a BGPAdvertisement carries it
	apiUp := true
	carried := func(id identity.Identity) bool { return attached[id] || advertised[id] }

	syncInventory := func() {
		if !apiUp {
			return
		}
		s.waitInventory("the chaos' objects", func(snap *inventory.Snapshot) bool {
			if snap.Healthy() != nil {
				return false
			}
			for _, id := range ids {
				if snap.Carried(id) != carried(id) {
					return false
				}
			}
			return true
		})
	}

	pass := func(step int) error {
		faulty := s.reg.fail.Load() || s.links.failDelete.Load()
		syncInventory()
		if rng.IntN(3) == 0 {
			time.Sleep(time.Duration(rng.IntN(int(2 * minAge)))) // a forced pass, at a random gap
		}
		started := time.Now()
		rep := s.r.Pass(ctx, reclaim.PassOptions{})
		ended := time.Now()
		healthy := rep.Result == reclaim.ResultCompleted
		if !apiUp && len(rep.Reclaimed) > 0 {
			return fmt.Errorf("step %d: a pass removed %v while the API server was stopped", step, rep.Reclaimed)
		}
		removed := map[uint32]bool{}
		for _, r := range rep.Reclaimed {
			removed[r.Ifindex] = true
		}
		for id, m := range taps {
			isHeld := m.holder != nil
			if removed[m.tap.Index] {
				if isHeld || carried(id) || !m.tap.Stamped() {
					return fmt.Errorf("step %d: pass removed %s (held %v, carried %v, stamp %q)", step, m.tap.Name, isHeld, carried(id), m.tap.Owner())
				}
				delete(taps, id)
				continue
			}
			if rows := s.rowsJSON(m.tap.Index); rows != m.rows {
				return fmt.Errorf("step %d: %s survived the pass without its rows and attachment:\nhad %s\nhas %s", step, m.tap.Name, m.rows, rows)
			}
			stale := !isHeld && !carried(id) && m.tap.Stamped()
			switch {
			case !stale || !healthy:
				m.staleRuns = 0
			case faulty:
				// Removal may fail on purpose; do not count the pass.
			case m.staleRuns == 0:
				m.staleRuns, m.firstStale = 1, ended
			default:
				m.staleRuns++
				if started.Sub(m.firstStale) >= minAge {
					return fmt.Errorf("step %d: %s stale for two healthy passes %v apart but kept (report %+v)", step, m.tap.Name, started.Sub(m.firstStale), rep)
				}
			}
		}
		for ifindex, runs := range orphans {
			if rows := s.rowsOf(ifindex); rows == 0 {
				delete(orphans, ifindex)
				continue
			}
			switch {
			case !healthy:
				orphans[ifindex] = 0
			case faulty:
			default:
				orphans[ifindex] = runs + 1
				if runs+1 >= 2 {
					return fmt.Errorf("step %d: rows of ifindex %d, deleted behind the node's back, left after two healthy passes (report %+v)", step, ifindex, rep)
				}
			}
		}
		return nil
	}

	stopAt, startAt := ops/3, ops/3+ops/20
	for step := range ops {
		if step == stopAt && apiUp {
			if err := cluster.Env.ControlPlane.GetAPIServer().Stop(); err != nil {
				return err
			}
			apiUp = false
			s.waitInventory("the read failure", func(snap *inventory.Snapshot) bool { return snap.Err != nil })
		}
		if step == startAt && !apiUp {
			if err := cluster.Env.ControlPlane.GetAPIServer().Start(); err != nil {
				return err
			}
			apiUp = true
		}
		id := ids[rng.IntN(len(ids))]
		m := taps[id]
		switch r := rng.IntN(100); {
		case r < 18 && m == nil:
			owner := ""
			if rng.IntN(10) > 0 {
				owner = fmt.Sprintf("sandbox-%d", step)
			}
			single := rng.IntN(4) == 0
			if owner == "" {
				nettest.NewTap(t, s.ns, id.TapName(), tun.Mode{SingleQueue: single})
				l, err := s.conn.GetByName(ctx, id.TapName())
				if err != nil {
					return err
				}
				tp, _ := l.AsTap()
				taps[id] = &tapModel{tap: tp, singleQueue: single}
			} else {
				taps[id] = &tapModel{tap: s.addTapMode(id, owner, single), singleQueue: single}
			}
			taps[id].rows = s.rowsJSON(taps[id].tap.Index)
		case r < 26 && m != nil && m.holder == nil:
			// CNI DEL, or the tap deleted behind the node's back, leaving
			// its rows and pin for the orphan collection.
			if rng.IntN(2) == 0 {
				if err := s.conn.DeleteVerified(ctx, link.Expect{Index: m.tap.Index, Name: m.tap.Name, Alias: m.tap.Owner()}); err != nil && !errors.Is(err, link.ErrLinkGone) {
					return err
				}
				if m.rows != s.rowsJSON(m.tap.Index) {
					return fmt.Errorf("step %d: rows of %s changed as its link was deleted", step, m.tap.Name)
				}
				orphans[m.tap.Index] = 0
				delete(taps, id)
				continue
			}
			if err := s.reg.Registry.UnregisterInterface(ctx, m.tap.Index); err != nil { // not through the fault seam
				return err
			}
			if err := s.conn.DeleteVerified(ctx, link.Expect{Index: m.tap.Index, Name: m.tap.Name, Alias: m.tap.Owner()}); err != nil && !errors.Is(err, link.ErrLinkGone) {
				return err
			}
			delete(taps, id)
		case r < 38 && m != nil && m.holder == nil:
			if m.singleQueue {
				m.holder = nettest.Hold(t, s.ns, m.tap.Name, nettest.HoldOptions{Mode: tun.Mode{SingleQueue: true}})
			} else {
				m.holder = nettest.Hold(t, s.ns, m.tap.Name, nettest.HoldOptions{Detached: rng.IntN(2)})
			}
		case r < 48 && m != nil && m.holder != nil:
			m.holder.Release()
			m.holder = nil
		case r < 51 && m != nil:
			up := rng.IntN(2) == 0
			if err := s.conn.Set(ctx, m.tap.Index, link.Change{Up: &up}); err != nil {
				return err
			}
		case r < 54 && m != nil:
			// Any CAP_NET_ADMIN process can force a tap's carrier, held or
			// not; tun refuses some changes (EPERM), which is fine here.
			_ = exec.Command("ip", "-n", s.ns.Name, "link", "set", m.tap.Name, "carrier", []string{"on", "off"}[rng.IntN(2)]).Run()
		case r < 66 && apiUp:
			name := fmt.Sprintf("att-%d-%d", id.VPC, id.Attachment)
			if attached[id] {
				s.cluster.Delete(t, kubeinventory.AttachmentResource, "tenant-chaos", name)
			} else {
				s.cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-chaos", name, id.VPC.Base62(), id.Attachment.Base62()))
			}
			attached[id] = !attached[id]
		case r < 74 && apiUp:
			if advertised[id] {
				s.cluster.Delete(t, kubeinventory.AdvertisementResource, "node-b", id.AdvertisementName())
			} else {
				s.cluster.Apply(t, kubeinventory.AdvertisementResource, clustertest.Advertisement("node-b", id.AdvertisementName(), "node-b"))
			}
			advertised[id] = !advertised[id]
		case r < 78:
			s.reg.fail.Store(rng.IntN(2) == 0)
			s.links.failDelete.Store(rng.IntN(3) == 0)
		case r < 100:
			if err := pass(step); err != nil {
				return err
			}
		}
	}
	s.reg.fail.Store(false)
	s.links.failDelete.Store(false)
	for range 3 {
		if err := pass(ops); err != nil {
			return err
		}
	}
	return nil
}

// TestNodeChaosNeverRemovesATapInUse runs 10,000 operations (fewer with
// GALACTICTEST_CHAOS_OPS) against real taps and a real API server.
func TestNodeChaosNeverRemovesATapInUse(t *testing.T) {
	seed := chaostest.Seed()
	if err := nodeChaos(t, seed, chaostest.Ops(10000), nil); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
}

// TestNodeChaosCatchesEachBrokenVariant runs the same chaos with one check
// broken at a time: each must be reported.
func TestNodeChaosCatchesEachBrokenVariant(t *testing.T) {
	for name, breakIt := range map[string]func(*reclaim.Reclaimer){
		"holder checks off":    (*reclaim.Reclaimer).BreakHeldCheck,
		"inventory checks off": (*reclaim.Reclaimer).BreakCarriedCheck,
		"removal off":          (*reclaim.Reclaimer).BreakRemoval,
	} {
		t.Run(name, func(t *testing.T) {
			seed := chaostest.Seed()
			err := nodeChaos(t, seed, chaostest.Ops(10000)/2, breakIt)
			if err == nil {
				t.Fatalf("seed %d: %s went unnoticed", seed, name)
			}
			t.Logf("caught: %v", err)
		})
	}
}
