package datapath_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// decisionRows returns the decisions rows of id, by decision.
func decisionRows(t *testing.T, dp *datapath.Datapath, id tenant) map[string]uint64 {
	t.Helper()
	rows, err := dp.Decisions.Dump(0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, r := range rows {
		if r.Key.VPC == id.VPC && r.Key.Attachment == id.Attachment {
			out[r.Key.Decision.String()] = r.Value
		}
	}
	return out
}

// Issue 21, case 6: decision rows go with their identity when its last
// interface is unregistered, and a re-created identity counts from zero.
func TestDecisionRowsGoWithTheirLastInterface(t *testing.T) {
	a := tenant{VPC: 62, Attachment: 72}
	b := tenant{VPC: 62, Attachment: 73}
	s := newTapScene(t, a)
	ctx := context.Background()
	allow := datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow}
	s.register(t, allow)

	// A second interface of the same identity, and one of another.
	twin, q2 := s.extraTap(t, "galtwin0")
	reg := s.registration(allow)
	if err := s.reg.RegisterInterface(ctx, twin, reg); err != nil {
		t.Fatal(err)
	}
	other, q3 := s.extraTap(t, b.TapName())
	reg.Identity = attachreg.IdentityOf(b.VPC, b.Attachment)
	if err := s.reg.RegisterInterface(ctx, other, reg); err != nil {
		t.Fatal(err)
	}
	m := []byte("g6#")
	s.write(t, farFrames(m)...)
	writeFd(t, q2, farFrames(m)...)
	writeFd(t, q3, farFrames(m)...)
	six := map[string]uint64{"allow": 4, "host_only": 2}
	if got := decisionRows(t, s.dp, a); !maps.Equal(got, six) {
		t.Fatalf("rows of %v = %v, want %v", a, got, six)
	}

	if err := s.reg.UnregisterInterface(ctx, twin); err != nil {
		t.Fatal(err)
	}
	if got := decisionRows(t, s.dp, a); !maps.Equal(got, six) {
		t.Fatalf("after unregistering one of its two interfaces, rows of %v = %v; want them kept", a, got)
	}
	if err := s.reg.UnregisterInterface(ctx, s.ifindex); err != nil {
		t.Fatal(err)
	}
	if got := decisionRows(t, s.dp, a); len(got) != 0 {
		t.Errorf("after unregistering its last interface, rows of %v = %v; want none", a, got)
	}
	if got := decisionRows(t, s.dp, b); !maps.Equal(got, map[string]uint64{"allow": 2, "host_only": 1}) {
		t.Errorf("rows of %v, whose interface stays, = %v; want them kept", b, got)
	}

	s.register(t, allow)
	s.write(t, farFrames(m)[0])
	if got := decisionRows(t, s.dp, a); !maps.Equal(got, map[string]uint64{"allow": 1}) {
		t.Errorf("re-created %v counts %v; want 1 allow, from zero", a, got)
	}
}

// Issue 21, case 6: once the decisions map is full, a new identity's frames
// are still judged and are counted as unattributed decisions_full.
func TestCountingContinuesWhenTheDecisionsMapIsFull(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 74})
	s.listen(t)
	fillDecisions(t, s.dp)
	s.register(t, datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow})

	m := []byte("g6-full#")
	before := s.counts(t)
	s.write(t, farFrames(m)...)
	s.write(t, eth(brMAC, vmMAC, nil, etIPv4, udpPkt4(gw4, 9999)(m))) // denied: unlisted gateway port
	if got := s.collectUntil(m, time.Second, delivery{bridge: true}); !got.bridge || len(got.socks) != 0 {
		t.Errorf("frames reached %+v; want the allowed ones on the bridge and none on the host's unlisted port", got)
	}
	if got := s.counts(t).since(before); !maps.Equal(got, map[string]uint64{"unattributed:" + datapath.ReasonDecisionsFull.String(): 4}) {
		t.Errorf("with the decisions map full: counted %v, want 4 as unattributed %v", got, datapath.ReasonDecisionsFull)
	}
}

// fillDecisions fills the decisions map with rows of identities no
// interface has.
func fillDecisions(t *testing.T, dp *datapath.Datapath) {
	t.Helper()
	m := dp.Decisions.Map()
	n := int(m.MaxEntries())
	type key struct {
		VPC        uint64
		Attachment uint16
		Decision   uint8
		_          [5]byte
	}
	keys := make([]key, n)
	vals := make([]uint64, n)
	for i := range keys {
		keys[i] = key{VPC: uint64(1000 + i/3), Attachment: 1, Decision: uint8(i % 3)}
	}
	if _, err := m.BatchUpdate(keys, vals, &ebpf.BatchOptions{}); err != nil {
		t.Fatalf("fill decisions: %v", err)
	}
}

// extraTap makes another tap on the scene's bridge, with a queue open, and
// returns its ifindex and queue.
func (s *tapScene) extraTap(t *testing.T, name string) (uint32, int) {
	t.Helper()
	nettest.NewTap(t, s.ns, name, tun.Mode{})
	q, err := tun.Open(s.ns.File, name, tun.Mode{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	s.ns.IP(t, "link", "set", name, "master", bridge, "up")
	l, err := s.ns.Dial(t).GetByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Index, int(q.Fd())
}
