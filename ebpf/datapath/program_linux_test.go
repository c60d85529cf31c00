package datapath_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// A daemon that starts again (an update of the same object) adopts the
// program pinned for this build, so taps keep the program they run and CNI
// ADD attaches that same one; a pin whose program reads maps since made
// again is replaced by the new daemon's.
func TestTheDaemonAdoptsThePinnedProgramOfItsBuild(t *testing.T) {
	bpffs := nettest.BPFFS(t)
	load := func() *datapath.Datapath {
		t.Helper()
		d, err := datapath.Load(bpffs)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		if err := d.AdoptProgram(); err != nil {
			t.Fatal(err)
		}
		return d
	}
	first := load()
	pinned, err := first.PinnedPrograms()
	if err != nil || len(pinned) != 1 || pinned[0].Name != datapath.ProgramName() || pinned[0].ID != first.ProgramID() {
		t.Fatalf("after the first start: pinned %+v (%v), want this build's program, ID %d", pinned, err, first.ProgramID())
	}
	if again := load(); again.ProgramID() != first.ProgramID() {
		t.Fatalf("a second start runs program %d, not the pinned %d of its build", again.ProgramID(), first.ProgramID())
	}
	cni, err := datapath.LoadPinned(bpffs)
	if err != nil {
		t.Fatal(err)
	}
	defer cni.Close()
	if cni.ProgramID() != first.ProgramID() {
		t.Errorf("CNI ADD loads program %d, the daemon runs %d", cni.ProgramID(), first.ProgramID())
	}

	// The state maps are made again: the pinned program reads the old.
	if err := os.RemoveAll(filepath.Join(bpffs, datapath.PinSubdir, datapath.StateSubdir)); err != nil {
		t.Fatal(err)
	}
	fresh := load()
	if fresh.ProgramID() == first.ProgramID() {
		t.Fatal("the daemon adopted a pinned program that reads state maps no longer pinned")
	}
	if pinned, _ := fresh.PinnedPrograms(); len(pinned) != 1 || pinned[0].ID != fresh.ProgramID() {
		t.Errorf("pinned %+v, want the new daemon's program %d", pinned, fresh.ProgramID())
	}
}
