package datapath_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
)

// farFrames are a tenant's frames that a default-allow policy passes: UDP
// elsewhere in both families (allow) and an ARP request for the gateway
// (host_only).
func farFrames(m []byte) [][]byte {
	return [][]byte{
		eth(brMAC, vmMAC, nil, etIPv4, udpPkt4(far4, 9999)(m)),
		eth(brMAC, vmMAC, nil, etIPv6, udpPkt6(far6, 9999)(m)),
		eth(bcastMAC, vmMAC, nil, etARP, append(arp(1, vmMAC, vm4, gw4), m...)),
	}
}

// Issue 21, case 5: a tenant tap is never unfiltered while it exists.
// UnregisterInterface alone (what a partial failure of ADD or of a teardown
// leaves) must leave the tap dropping every frame, counted as
// policy_unavailable, until its link is gone; then the attachment goes too.
func TestAnUnregisteredTapDropsEverythingUntilItsLinkIsGone(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 71})
	s.listen(t)
	ctx := context.Background()
	s.register(t, datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow})

	m := []byte("g5-registered#")
	before := s.counts(t)
	s.write(t, farFrames(m)...)
	if got := s.collectUntil(m, time.Second, delivery{bridge: true}); !got.bridge {
		t.Fatal("a registered tap's allowed frames did not reach the bridge")
	}
	if got := s.counts(t).since(before); !maps.Equal(got, map[string]uint64{"allow": 2, "host_only": 1}) {
		t.Fatalf("registered: counted %v, want 2 allow and 1 host_only", got)
	}

	if err := s.reg.UnregisterInterface(ctx, s.ifindex); err != nil {
		t.Fatal(err)
	}
	m = []byte("g5-unregistered#")
	before = s.counts(t)
	s.write(t, farFrames(m)...)
	if got := s.collectUntil(m, 50*time.Millisecond, delivery{}); got.bridge || len(got.socks) > 0 {
		t.Errorf("after UnregisterInterface, with the link still there, frames reached %+v; want dropped", got)
	}
	if got := s.counts(t).since(before); !maps.Equal(got, map[string]uint64{"unattributed:policy_unavailable": 3}) {
		t.Errorf("after UnregisterInterface: counted %v, want 3 policy_unavailable", got)
	}
	rows, err := s.reg.Rows(s.ifindex)
	if err != nil || len(rows.Rows) != 0 || !rows.Attached {
		t.Errorf("Rows after UnregisterInterface = %+v, %v; want no rows and the program still attached", rows, err)
	}
	// Unregistering again while the link exists changes nothing.
	if err := s.reg.UnregisterInterface(ctx, s.ifindex); err != nil {
		t.Fatal(err)
	}

	s.ns.IP(t, "link", "del", s.name)
	if err := s.reg.UnregisterInterface(ctx, s.ifindex); err != nil {
		t.Fatal(err)
	}
	if rows, err := s.reg.Rows(s.ifindex); err != nil || rows.Attached {
		t.Fatalf("Rows once the link is gone = %+v, %v; want the attachment gone", rows, err)
	}
	regs, err := s.reg.Registered()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range regs {
		if r.Ifindex == s.ifindex {
			t.Fatalf("the gone interface is still listed: %+v", r)
		}
	}
}
