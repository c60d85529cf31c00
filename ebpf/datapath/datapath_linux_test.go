package datapath_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// TestCommittedObjectMatchesTheCSource fails when bpf/datapath.c changed and
// `make generate` was not run: the committed object would be stale.
func TestCommittedObjectMatchesTheCSource(t *testing.T) {
	src, err := os.ReadFile("bpf/datapath.c")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("bpf/datapath.c.sha256")
	if err != nil {
		t.Fatalf("%v: run make generate", err)
	}
	sum := sha256.Sum256(src)
	if got := hex.EncodeToString(sum[:]); got != strings.TrimSpace(string(want)) {
		t.Fatalf("bpf/datapath.c (sha256 %s) changed since datapath_bpfel.o was generated (%s): run make generate",
			got, strings.TrimSpace(string(want)))
	}
}

func load(t *testing.T, bpffs string) *datapath.Datapath {
	t.Helper()
	d, err := datapath.Load(bpffs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestASecondLoadOfThePinFolderSeesTheRows(t *testing.T) {
	bpffs := nettest.BPFFS(t)
	d1 := load(t, bpffs)
	row := datapath.VRFBinding{Table: 1062, VPC: 62, Attachment: 65}
	if err := d1.IfindexVRF.Put(7, row); err != nil {
		t.Fatal(err)
	}
	d1.Close()

	d2 := load(t, bpffs)
	got, err := d2.IfindexVRF.Get(7)
	if err != nil || got != row {
		t.Fatalf("after reload: %+v, %v; want %+v", got, err, row)
	}
	if _, err := os.Stat(filepath.Join(bpffs, datapath.PinSubdir, "ifindex_vrf")); err != nil {
		t.Fatalf("pin: %v", err)
	}
}

func TestLoadMountsBPFFSWhereNoneIs(t *testing.T) {
	nettest.RequirePrivileged(t)
	dir := t.TempDir()
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	load(t, dir)
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || st.Type != 0xcafe4a11 {
		t.Fatalf("statfs %s: type %#x, %v; want bpffs", dir, st.Type, err)
	}
}

func TestAnIncompatiblePinnedMapIsAnErrorNotReplaced(t *testing.T) {
	bpffs := nettest.BPFFS(t)
	pinDir := filepath.Join(bpffs, datapath.PinSubdir)
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "traffic_policy", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(filepath.Join(pinDir, "traffic_policy")); err != nil {
		t.Fatal(err)
	}
	if _, err := datapath.Load(bpffs); !errors.Is(err, datapath.ErrIncompatiblePins) || !strings.Contains(err.Error(), "traffic_policy") {
		t.Fatalf("Load over an incompatible pinned map = %v; want ErrIncompatiblePins naming it", err)
	}
}

func TestRowsRoundTripAndReadAsJSON(t *testing.T) {
	d := load(t, nettest.BPFFS(t))
	policy := datapath.Policy{Generation: 3, DefaultAction: datapath.ActionDeny, Ethertypes: []uint16{0x0800, 0x86dd}, Protocols: []datapath.Protocol{datapath.ProtocolTCP, datapath.ProtocolUDP}}
	gw := datapath.Gateway{IPv4: netip.MustParseAddr("10.0.0.1"), IPv6: netip.MustParseAddr("fd00::1")}
	port := datapath.HostPort{Ifindex: 7, Protocol: datapath.ProtocolUDP, Port: 53}
	for _, err := range []error{
		d.IfindexVRF.Put(7, datapath.VRFBinding{Table: 1062, VPC: 62, Attachment: 65}),
		d.TrafficPolicy.Put(7, policy),
		d.EgressKind.Put(7, datapath.EgressTap),
		d.TenantGateway.Put(7, gw),
		d.HostOnlyPort.Put(port, true),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got, err := d.TrafficPolicy.Get(7); err != nil || got.Generation != 3 || len(got.Ethertypes) != 2 || got.Protocols[1] != 17 {
		t.Fatalf("policy %+v, %v", got, err)
	}
	if got, err := d.TenantGateway.Get(7); err != nil || got != gw {
		t.Fatalf("gateway %+v, %v", got, err)
	}
	want := map[string]string{
		"ifindex_vrf":    `[{"key":7,"value":{"table":1062,"vpc":"10","attachment":"13"}}]`,
		"traffic_policy": `[{"key":7,"value":{"generation":3,"defaultAction":"deny","ethertypes":[2048,34525],"protocols":["tcp","udp"]}}]`,
		"egress_kind":    `[{"key":7,"value":"tap"}]`,
		"tenant_gateway": `[{"key":7,"value":{"ipv4":"10.0.0.1","ipv6":"fd00::1"}}]`,
		"host_only_port": `[{"key":{"ifindex":7,"protocol":"udp","port":53},"value":true}]`,
	}
	for name, js := range want {
		tbl, err := d.Table(name)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tbl.DumpAny(0)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(rows)
		if string(b) != js {
			t.Errorf("%s as JSON:\n got %s\nwant %s", name, b, js)
		}
	}
	if err := d.IfindexVRF.Delete(7); err != nil {
		t.Fatal(err)
	}
	if err := d.IfindexVRF.Delete(7); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("second Delete = %v, want ErrKeyNotExist", err)
	}
}

func TestBadRowsAndNamesAreRefused(t *testing.T) {
	d := load(t, nettest.BPFFS(t))
	for name, err := range map[string]error{
		"ifindex 0":      d.IfindexVRF.Put(0, datapath.VRFBinding{Table: 1, VPC: 1}),
		"vpc 0":          d.IfindexVRF.Put(1, datapath.VRFBinding{Table: 1}),
		"table 0":        d.IfindexVRF.Put(1, datapath.VRFBinding{VPC: 1}),
		"9 ethertypes":   d.TrafficPolicy.Put(1, datapath.Policy{Ethertypes: make([]uint16, 9)}),
		"unknown action": d.TrafficPolicy.Put(1, datapath.Policy{DefaultAction: 7}),
		"egress kind 0":  d.EgressKind.Put(1, 0),
		"v6 as gateway4": d.TenantGateway.Put(1, datapath.Gateway{IPv4: netip.MustParseAddr("fd00::1")}),
		"host port icmp": d.HostOnlyPort.Put(datapath.HostPort{Ifindex: 1, Protocol: 1, Port: 1}, true),
		"host port 0":    d.HostOnlyPort.Put(datapath.HostPort{Ifindex: 1, Protocol: datapath.ProtocolTCP}, true),
		"host ifindex 0": d.HostOnlyPort.Put(datapath.HostPort{Protocol: datapath.ProtocolTCP, Port: 22}, true),
	} {
		if !errors.Is(err, datapath.ErrInvalidRow) {
			t.Errorf("%s: %v, want ErrInvalidRow", name, err)
		}
	}
	for _, tbl := range d.Tables() {
		if rows, err := tbl.DumpAny(0); err != nil || (len(rows) != 0 && tbl.Name() != "unattributed") {
			t.Errorf("%s after refused writes: %d rows, %v", tbl.Name(), len(rows), err)
		}
	}
	if _, err := d.Table("no_such_map"); !errors.Is(err, datapath.ErrUnknownMap) {
		t.Fatalf("Table(no_such_map) = %v, want ErrUnknownMap", err)
	}
}
