package attachreg_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// counterMaps are the maps not keyed by an interface: decision counters
// keyed by identity, unattributed counters keyed by reason. Every other
// pinned map holds per-interface rows keyed by a key that starts with the
// ifindex, and UnregisterInterface must clear it.
var counterMaps = map[string]bool{"decisions": true, "unattributed": true}

type scene struct {
	ns  *nettest.NS
	dp  *datapath.Datapath
	reg *attachreg.Registry
}

func newScene(t *testing.T) *scene {
	nettest.RequireTCX(t) // RegisterInterface attaches at TCX ingress
	ns := nettest.NewNS(t)
	dp, err := datapath.Load(nettest.BPFFS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	return &scene{ns: ns, dp: dp, reg: attachreg.New(dp, ns.File, nil)}
}

// tap creates an up tenant tap and returns its ifindex and a queue file the
// test writes frames into, as a VMM would.
func (s *scene) tap(t *testing.T, id identity.Identity) (uint32, *os.File) {
	t.Helper()
	name := id.TapName()
	nettest.NewTap(t, s.ns, name, tun.Mode{})
	s.ns.IP(t, "link", "set", name, "up")
	l, err := s.ns.Dial(t).GetByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	f, err := tun.Open(s.ns.File, name, tun.Mode{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return l.Index, f
}

func registration(id identity.Identity) attachreg.Registration {
	return attachreg.Registration{
		Identity: id,
		Table:    1062,
		Egress:   datapath.EgressTap,
		Policy:   datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow, Ethertypes: []uint16{0x0800, 0x86dd}},
		Gateway:  datapath.Gateway{IPv4: netip.MustParseAddr("10.0.0.1")},
		HostOnlyPorts: []attachreg.ProtoPort{
			{Protocol: datapath.ProtocolUDP, Port: 53},
		},
		Addresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/32")}, // frame's source
	}
}

// frame builds an Ethernet frame: IPv4 with a UDP or TCP header to dst:port,
// or a bare frame of another ethertype.
func frame(ethertype uint16, proto uint8, dst string, port uint16) []byte {
	b := make([]byte, 14, 64)
	copy(b[0:6], []byte{0x02, 0, 0, 0, 0, 1})
	copy(b[6:12], []byte{0x02, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(b[12:14], ethertype)
	if ethertype != 0x0800 {
		return append(b, make([]byte, 46)...)
	}
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], 20+8)
	ip[8] = 64
	ip[9] = proto
	copy(ip[12:16], netip.MustParseAddr("10.0.0.2").AsSlice())
	copy(ip[16:20], netip.MustParseAddr(dst).AsSlice())
	l4 := make([]byte, 8)
	binary.BigEndian.PutUint16(l4[0:2], 40000)
	binary.BigEndian.PutUint16(l4[2:4], port)
	b = append(append(b, ip...), l4...)
	return append(b, make([]byte, 64-len(b))...)
}

func write(t *testing.T, f *os.File, frames ...[]byte) {
	t.Helper()
	for _, fr := range frames {
		if _, err := f.Write(fr); err != nil {
			t.Fatalf("write frame: %v", err)
		}
	}
}

// waitCount polls a counter until it reaches want: the kernel processes
// frames written into a tap asynchronously (softirq).
func waitCount(t *testing.T, what string, get func() uint64, want uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := get()
		if got == want {
			return
		}
		if got > want || time.Now().After(deadline) {
			t.Fatalf("%s = %d, want %d", what, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *scene) decisions(id identity.Identity, d datapath.Decision) func() uint64 {
	return func() uint64 {
		n, _ := s.dp.Decisions.Get(attachreg.DecisionKey(id, d))
		return n
	}
}

func (s *scene) unattributed(r datapath.Reason) func() uint64 {
	return func() uint64 {
		n, _ := s.dp.Unattributed.Get(r)
		return n
	}
}

func TestFramesAreCountedAsThePolicyDictates(t *testing.T) {
	s := newScene(t)
	id := identity.Identity{VPC: 62, Attachment: 65}
	ifindex, q := s.tap(t, id)
	if err := s.reg.RegisterInterface(context.Background(), ifindex, registration(id)); err != nil {
		t.Fatal(err)
	}
	// The node routes its tenants: with forwarding on and 10.9.9.9 routed
	// away, the program judges it by the default action; an address the
	// host does not forward would be the host's (docs/datapath.md).
	nettest.Run(t, "ip", "netns", "exec", s.ns.Name, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	s.ns.IP(t, "link", "add", "galaway0", "type", "veth", "peer", "name", "galaway1")
	s.ns.IP(t, "link", "set", "galaway0", "up")
	s.ns.IP(t, "route", "add", "default", "dev", "galaway0")
	write(t, q,
		frame(0x0800, 17, "10.0.0.1", 53), // host-only port on the gateway
		frame(0x0800, 6, "10.0.0.1", 22),  // gateway port not listed: deny
		frame(0x0800, 17, "10.9.9.9", 53), // elsewhere: default allow
		frame(0x0800, 6, "10.9.9.9", 443), // elsewhere: default allow
		frame(0x0806, 0, "", 0),           // ARP is not an allowed ethertype: deny
	)
	waitCount(t, "allow", s.decisions(id, datapath.DecisionAllow), 2)
	waitCount(t, "deny", s.decisions(id, datapath.DecisionDeny), 2)
	waitCount(t, "host_only", s.decisions(id, datapath.DecisionHostOnly), 1)

	// A policy with default deny: the same frame elsewhere is now denied.
	reg := registration(id)
	reg.Policy.DefaultAction = datapath.ActionDeny
	reg.Policy.Generation = 2
	if err := s.reg.RegisterInterface(context.Background(), ifindex, reg); err != nil {
		t.Fatal(err)
	}
	write(t, q, frame(0x0800, 17, "10.9.9.9", 53))
	waitCount(t, "deny after default deny", s.decisions(id, datapath.DecisionDeny), 3)
	if n := s.unattributed(datapath.ReasonPolicyUnavailable)(); n != 0 {
		t.Fatalf("policy_unavailable = %d for a registered tap", n)
	}
}

func TestWithoutAPolicyRowFramesAreUnattributedPolicyUnavailable(t *testing.T) {
	s := newScene(t)
	id := identity.Identity{VPC: 62, Attachment: 66}
	ifindex, q := s.tap(t, id)
	if err := s.reg.RegisterInterface(context.Background(), ifindex, registration(id)); err != nil {
		t.Fatal(err)
	}
	if err := s.dp.RemoveRules(ifindex); err != nil {
		t.Fatal(err)
	}
	write(t, q, frame(0x0800, 17, "10.0.0.1", 53), frame(0x0800, 17, "10.9.9.9", 53))
	waitCount(t, "policy_unavailable", s.unattributed(datapath.ReasonPolicyUnavailable), 2)
	for _, d := range []datapath.Decision{datapath.DecisionAllow, datapath.DecisionDeny, datapath.DecisionHostOnly} {
		if n := s.decisions(id, d)(); n != 0 {
			t.Errorf("%v = %d; frames without a policy must not be attributed", d, n)
		}
	}
}

func pinnedRowsKeyedBy(t *testing.T, dp *datapath.Datapath, ifindex uint32) map[string]int {
	t.Helper()
	return nettest.PinnedRowsKeyedBy(t, dp.PinDir(), ifindex, counterMaps)
}

// seedEveryPerInterfaceMap writes a raw row keyed by ifindex into every
// pinned per-interface map, so that a map added to the datapath but not to
// attachreg keeps a row and fails the test.
func seedEveryPerInterfaceMap(t *testing.T, dp *datapath.Datapath, ifindex uint32) {
	t.Helper()
	entries, _ := os.ReadDir(dp.PinDir())
	for _, e := range entries {
		if e.IsDir() || counterMaps[e.Name()] || e.Name() == "host_only_port" {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(dp.PinDir(), e.Name()), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.Type() == ebpf.HashOfMaps {
			m.Close()
			continue // its rows are maps: registering made ifindex's
		}
		key := make([]byte, m.KeySize())
		binary.NativeEndian.PutUint32(key, ifindex)
		if err := m.Update(key, make([]byte, m.ValueSize()), ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			t.Fatalf("seed %s: %v", e.Name(), err)
		}
		m.Close()
	}
}

func TestUnregisterLeavesNoRowOfTheInterfaceInAnyMap(t *testing.T) {
	s := newScene(t)
	ctx := context.Background()
	a, b := identity.Identity{VPC: 62, Attachment: 1}, identity.Identity{VPC: 62, Attachment: 2}
	ia, _ := s.tap(t, a)
	ib, _ := s.tap(t, b)
	for ifindex, id := range map[uint32]identity.Identity{ia: a, ib: b} {
		reg := registration(id)
		reg.Gateway.IPv6 = netip.MustParseAddr("fd00::1")
		reg.HostOnlyPorts = append(reg.HostOnlyPorts, attachreg.ProtoPort{Protocol: datapath.ProtocolTCP, Port: 22})
		if err := s.reg.RegisterInterface(ctx, ifindex, reg); err != nil {
			t.Fatal(err)
		}
	}
	seedEveryPerInterfaceMap(t, s.dp, ia)
	before := pinnedRowsKeyedBy(t, s.dp, ia)
	if len(before) < len(s.reg.PerInterfaceMaps()) || before["host_only_port"] != 2 {
		t.Fatalf("rows before unregister: %v", before)
	}
	rowsB := pinnedRowsKeyedBy(t, s.dp, ib)
	if rows, _ := s.reg.Rows(ia); !rows.Attached {
		t.Fatal("program not attached after register")
	}

	if err := s.reg.UnregisterInterface(ctx, ia); err != nil {
		t.Fatal(err)
	}
	if left := pinnedRowsKeyedBy(t, s.dp, ia); len(left) != 0 {
		t.Fatalf("rows keyed by ifindex %d after unregister: %v", ia, left)
	}
	// The tap still exists: the program stays attached, dropping its
	// frames, until the link is gone.
	rows, err := s.reg.Rows(ia)
	if err != nil || len(rows.Rows) != 0 || !rows.Attached {
		t.Fatalf("Rows after unregister = %+v, %v", rows, err)
	}
	if after := pinnedRowsKeyedBy(t, s.dp, ib); len(after) != len(rowsB) || after["host_only_port"] != rowsB["host_only_port"] {
		t.Fatalf("the other interface's rows changed: before %v, after %v", rowsB, after)
	}
	if rows, _ := s.reg.Rows(ib); !rows.Attached {
		t.Fatal("the other interface's program was detached")
	}
	if err := s.reg.UnregisterInterface(ctx, ia); err != nil {
		t.Fatalf("second unregister = %v, want nil", err)
	}
}

// TestAnUnregisterKilledAnywhereLeavesWhatItsIdentityFinds: the teardown
// deletes the tap and then unregisters it; a DEL killed between two steps of
// the unregister is retried by the runtime for the same identity, and that
// retry finds the gone tap's leftovers by the identity Registered reports.
// Left rows or a left pin that name no identity would stay forever (as a
// kill after the ifindex_vrf row once left a pinned TCX link).
func TestAnUnregisterKilledAnywhereLeavesWhatItsIdentityFinds(t *testing.T) {
	s := newScene(t)
	ctx := context.Background()
	for k := 0; ; k++ {
		id := identity.Identity{VPC: 62, Attachment: identity.Attachment(100 + k)}
		ifindex, f := s.tap(t, id)
		if err := s.reg.RegisterInterface(ctx, ifindex, registration(id)); err != nil {
			t.Fatal(err)
		}
		f.Close()
		s.ns.IP(t, "link", "del", id.TapName())
		steps := s.reg.UnregisterKilledAfter(ifindex, k)
		regs, err := s.reg.Registered()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range regs {
			if r.Ifindex == ifindex && r.Identity != id {
				t.Fatalf("killed after step %d of %d: interface %d is left as %+v, naming no identity", k, steps, ifindex, r)
			}
		}
		if err := s.reg.UnregisterInterface(ctx, ifindex); err != nil {
			t.Fatal(err)
		}
		if k >= steps {
			break
		}
	}
	if regs, err := s.reg.Registered(); err != nil || len(regs) != 0 {
		t.Fatalf("left after every retried unregister: %+v, %v", regs, err)
	}
}

func TestAFailingMapDeleteDoesNotStopTheOthers(t *testing.T) {
	s := newScene(t)
	ctx := context.Background()
	id := identity.Identity{VPC: 62, Attachment: 3}
	ifindex, _ := s.tap(t, id)
	if err := s.reg.RegisterInterface(ctx, ifindex, registration(id)); err != nil {
		t.Fatal(err)
	}
	err := s.reg.UnregisterWithFault(ctx, ifindex, func(name string) error {
		if name == "egress_kind" {
			return errors.New("injected fault")
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "map egress_kind") || !strings.Contains(err.Error(), "injected fault") {
		t.Fatalf("UnregisterInterface = %v; want an error naming egress_kind", err)
	}
	left := pinnedRowsKeyedBy(t, s.dp, ifindex)
	if len(left) != 1 || left["egress_kind"] != 1 {
		t.Fatalf("rows left: %v; want only the failing map's", left)
	}
	if err := s.reg.UnregisterInterface(ctx, ifindex); err != nil {
		t.Fatal(err)
	}
	if left := pinnedRowsKeyedBy(t, s.dp, ifindex); len(left) != 0 {
		t.Fatalf("rows left after the fault cleared: %v", left)
	}
}

func TestBadRegistrationsWriteNothing(t *testing.T) {
	s := newScene(t)
	ctx := context.Background()
	id := identity.Identity{VPC: 62, Attachment: 4}
	ifindex, _ := s.tap(t, id)
	for name, tc := range map[string]struct {
		ifindex uint32
		mutate  func(*attachreg.Registration)
	}{
		"ifindex 0":        {0, func(*attachreg.Registration) {}},
		"invalid identity": {ifindex, func(r *attachreg.Registration) { r.Identity.VPC = 0 }},
		"table 0":          {ifindex, func(r *attachreg.Registration) { r.Table = 0 }},
		"egress unknown":   {ifindex, func(r *attachreg.Registration) { r.Egress = 9 }},
		"icmp host port":   {ifindex, func(r *attachreg.Registration) { r.HostOnlyPorts[0].Protocol = 1 }},
		"9 protocols":      {ifindex, func(r *attachreg.Registration) { r.Policy.Protocols = make([]datapath.Protocol, 9) }},
	} {
		reg := registration(id)
		tc.mutate(&reg)
		if err := s.reg.RegisterInterface(ctx, tc.ifindex, reg); !errors.Is(err, attachreg.ErrInvalidRegistration) {
			t.Errorf("%s: %v, want ErrInvalidRegistration", name, err)
		}
	}
	for _, tbl := range s.dp.Tables() {
		if rows, _ := tbl.DumpAny(0); len(rows) != 0 && tbl.Name() != "unattributed" {
			t.Errorf("map %s has %d rows after refused registrations", tbl.Name(), len(rows))
		}
	}
	if rows, _ := s.reg.Rows(ifindex); rows.Attached {
		t.Error("program attached by a refused registration")
	}
	if err := s.reg.UnregisterInterface(ctx, 0); !errors.Is(err, attachreg.ErrInvalidRegistration) {
		t.Errorf("UnregisterInterface(0) = %v", err)
	}
	if _, err := s.reg.Dump("no_such_map", 10); !errors.Is(err, datapath.ErrUnknownMap) {
		t.Errorf("Dump(no_such_map) = %v, want ErrUnknownMap", err)
	}
}
