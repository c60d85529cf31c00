package datapath_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

func mapID(t *testing.T, path string) ebpf.MapID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// Every loaded instance of the program (one per CNI ADD) shares one copy of
// each state map, pinned in the state folder; one of another layout is
// replaced, as it holds nothing worth keeping.
func TestLoadsShareTheStateMapsAndReplaceThoseOfAnotherLayout(t *testing.T) {
	bpffs := nettest.BPFFS(t)
	dir := filepath.Join(bpffs, datapath.PinSubdir, datapath.StateSubdir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(filepath.Join(dir, "route_cache")); err != nil {
		t.Fatal(err)
	}
	load(t, bpffs)
	ids := map[string]ebpf.MapID{}
	for _, name := range []string{"route_cache", "route_epoch", "host_filter", "host_view"} {
		ids[name] = mapID(t, filepath.Join(dir, name))
	}
	if info, _ := old.Info(); info != nil {
		if id, _ := info.ID(); id == ids["route_cache"] {
			t.Fatal("the route_cache of another layout was kept")
		}
	}
	d2 := load(t, bpffs)
	for name, id := range ids {
		if got := mapID(t, filepath.Join(dir, name)); got != id {
			t.Errorf("%s: a second load pinned map %d, want the first's %d", name, got, id)
		}
	}
	// The second instance's program uses the pinned copies.
	info, err := d2.Program().Info()
	if err != nil {
		t.Fatal(err)
	}
	used, _ := info.MapIDs()
	for name, id := range ids {
		found := false
		for _, u := range used {
			found = found || u == id
		}
		if !found {
			t.Errorf("the second instance's program does not use the pinned %s (map %d; uses %v)", name, id, used)
		}
	}
}

// The route answers are cached for a bounded time: an address added to the
// VRF is the host's, and its unlisted ports denied, once that time passed.
func TestAnAddressAddedToTheVRFIsTheHostsOnceTheCachedAnswerExpires(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 76})
	s.listen(t)
	s.register(t, datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow})
	const added = "10.9.9.10"
	frame := func(m []byte) []byte { return eth(brMAC, vmMAC, nil, etIPv4, udpPkt4(added, 9999)(m)) }

	before := s.counts(t)
	s.write(t, frame([]byte("g-cache-1#")))
	if got := s.counts(t).since(before); got["allow"] != 1 {
		t.Fatalf("to %s while it is routed away: counted %v, want allow", added, got)
	}
	s.ns.IP(t, "addr", "add", added+"/32", "dev", bridge)
	// 64 jiffies: 640 ms at the lowest HZ (100).
	time.Sleep(700 * time.Millisecond)
	m := []byte("g-cache-2#")
	before = s.counts(t)
	s.write(t, frame(m))
	if got := s.counts(t).since(before); got["deny"] != 1 {
		t.Errorf("to %s once it is the host's: counted %v, want deny", added, got)
	}
	if got := s.collectUntil(m, 50*time.Millisecond, delivery{}); got.bridge || len(got.socks) > 0 {
		t.Errorf("to %s once it is the host's: reached %+v, want dropped", added, got)
	}
}
