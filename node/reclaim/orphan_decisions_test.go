package reclaim

import (
	"maps"
	"testing"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// decisionsOf reads the decisions rows of id from the real map.
func decisionsOf(t *testing.T, dp *datapath.Datapath, id identity.Identity) map[datapath.Decision]uint64 {
	t.Helper()
	rows, err := dp.Decisions.Dump(0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[datapath.Decision]uint64{}
	for _, r := range rows {
		if attachreg.IdentityOf(r.Key.VPC, r.Key.Attachment) == id {
			out[r.Key.Decision] = r.Value
		}
	}
	return out
}

// Issue 21, case 6: decisions rows of an identity that no registered
// interface names (left by a build that never removed them, or by a crash
// between an interface's rows and its counters) go with the orphan
// collection; rows of a registered identity stay, and a dry run or a VPC
// whose lock is not had removes nothing.
func TestDecisionRowsOfIdentitiesWithoutInterfacesGoWithTheOrphanCollection(t *testing.T) {
	dp, err := datapath.Load(nettest.BPFFS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	h := newHarness(liveInventory(), Config{})
	h.r.useRegistry(attachreg.New(dp, nil, nil))

	leaked := identity.Identity{VPC: 99, Attachment: 1}
	busy := identity.Identity{VPC: 98, Attachment: 1}
	idx := h.links.addTap(live, "sandbox-1", 1, 0)
	if err := dp.IfindexVRF.Put(idx, attachreg.VRFBinding(live, 1062)); err != nil {
		t.Fatal(err)
	}
	want := map[datapath.Decision]uint64{datapath.DecisionAllow: 5, datapath.DecisionDeny: 2}
	for _, id := range []identity.Identity{leaked, busy, live} {
		for d, n := range want {
			if err := dp.Decisions.Put(attachreg.DecisionKey(id, d), n); err != nil {
				t.Fatal(err)
			}
		}
	}

	h.r.Pass(t.Context(), PassOptions{DryRun: true})
	if got := decisionsOf(t, dp, leaked); !maps.Equal(got, want) {
		t.Fatalf("after a dry run, rows of %v = %v; want them kept", leaked, got)
	}
	h.lock.busy = map[identity.VPC]bool{busy.VPC: true}
	rep := h.pass(t)
	if got := decisionsOf(t, dp, leaked); len(got) != 0 {
		t.Errorf("rows of %v, which no interface names, = %v after a pass; want none", leaked, got)
	}
	if got := decisionsOf(t, dp, live); !maps.Equal(got, want) {
		t.Errorf("rows of %v, whose interface is registered, = %v; want them kept", live, got)
	}
	if got := decisionsOf(t, dp, busy); !maps.Equal(got, want) || len(rep.OrphanErrors) == 0 {
		t.Errorf("rows of %v, whose VRF lock was busy, = %v (errors %v); want them kept and the lock reported", busy, got, rep.OrphanErrors)
	}
}
