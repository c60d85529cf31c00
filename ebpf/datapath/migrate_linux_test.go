package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// olderPins pins, for each name, a map of this build's layout but capacity
// 16, as a build with other sizes left them, and returns a Datapath whose
// tables write to them.
func olderPins(t *testing.T, bpffs string, names ...string) *Datapath {
	t.Helper()
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	pinDir := filepath.Join(bpffs, PinSubdir)
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		t.Fatal(err)
	}
	d := &Datapath{pinDir: pinDir}
	for _, name := range names {
		ms := spec.Maps[name].Copy()
		ms.MaxEntries, ms.Pinning = 16, ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Cleanup(func() { _ = m.Close() })
		if err := m.Pin(filepath.Join(pinDir, name)); err != nil {
			t.Fatal(err)
		}
		switch name {
		case "ifindex_vrf":
			d.objs.IfindexVrf = m
		case "tap_rules":
			d.objs.TapRules = m
		case "tap_fragments":
			d.objs.TapFragments = m
		case "traffic_policy":
			d.objs.TrafficPolicy = m
		}
	}
	d.assignTables(spec.Maps[datapathMapTapFragments].InnerMap)
	return d
}

// A build whose maps are larger (or smaller) loads over pins of another
// capacity: each such map is made again at this build's capacity with every
// row (a spin-locked one and a map of maps included), and its pin swapped.
func TestLoadMigratesPinsOfAnotherCapacity(t *testing.T) {
	bpffs := nettest.BPFFS(t)
	older := olderPins(t, bpffs, "ifindex_vrf", "tap_rules", "tap_fragments")
	rules := Rules{Ifindex: 7, VPC: 10, Attachment: 3, Policy: Policy{DefaultAction: ActionDeny, Protocols: []Protocol{ProtocolUDP}},
		Gateway: Gateway{IPv4: netip.MustParseAddr("10.0.0.1")}, HostPorts: []Port{{Protocol: ProtocolUDP, Port: 53}},
		Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.7/32")}}
	binding := VRFBinding{Table: 1010, VPC: 10, Attachment: 3}
	if err := errors.Join(older.IfindexVRF.Put(7, binding), older.TapRules.Put(7, rules), older.TapFragments.Ensure(7)); err != nil {
		t.Fatal(err)
	}
	inner, err := older.TapFragments.Get(7)
	if err != nil {
		t.Fatal(err)
	}

	d, err := Load(bpffs)
	if err != nil {
		t.Fatalf("load over pins of another capacity: %v", err)
	}
	defer d.Close()
	if got := d.Migrated(); !slices.Equal(got, []string{"ifindex_vrf", "tap_fragments", "tap_rules"}) {
		t.Errorf("migrated %v", got)
	}
	if got, err := d.IfindexVRF.Get(7); err != nil || got != binding {
		t.Errorf("ifindex_vrf after the migration: %+v (%v), want %+v", got, err, binding)
	}
	if got, err := d.TapRules.Get(7); err != nil || fmt.Sprint(got) != fmt.Sprint(rules) {
		t.Errorf("tap_rules after the migration: %+v (%v), want %+v", got, err, rules)
	}
	if got, err := d.TapFragments.Get(7); err != nil || got != inner {
		t.Errorf("tap_fragments after the migration: inner map %d (%v), want the same %d", got, err, inner)
	}
	for _, name := range []string{"ifindex_vrf", "tap_rules", "tap_fragments"} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, PinSubdir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.MaxEntries() == 16 {
			t.Errorf("%s is still pinned at the older capacity", name)
		}
		_ = m.Close()
	}
	if _, err := os.Stat(filepath.Join(bpffs, PinSubdir, "tap_rules"+migratingSuffix)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a migration pin is left: %v", err)
	}
}

// Pins of which one differs by more than its capacity are left exactly as
// they are, so that the build that reads them still can: Load refuses them.
func TestLoadMigratesNothingWhenAPinDiffersOtherwise(t *testing.T) {
	bpffs := nettest.BPFFS(t)
	olderPins(t, bpffs, "ifindex_vrf")
	pin := filepath.Join(bpffs, PinSubdir, "traffic_policy")
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "traffic_policy", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bpffs); !errors.Is(err, ErrIncompatiblePins) {
		t.Fatalf("load over a pin of another value size: %v, want ErrIncompatiblePins", err)
	}
	vrf, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, PinSubdir, "ifindex_vrf"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer vrf.Close()
	if vrf.MaxEntries() != 16 {
		t.Errorf("ifindex_vrf was migrated although the load was refused: %d entries", vrf.MaxEntries())
	}
}
