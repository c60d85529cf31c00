package datapath_test

import (
	"net"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/netns"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// TestWithoutTheDaemonNoFrameReachesAnotherMachineAfterAnAddressLeavesTheHost
// is issue 49's item 2. A default-deny tenant may reach the host's udp/53
// only; an address the host held leaves it and from then on routes to
// another machine (a namespace behind a veth, listening on that address's
// udp/53). With no route watcher running (the daemon restarting, killed,
// or not yet started), nothing bumps the route epoch: before the fix, the
// program's cached answer ("the host's") was trusted for its whole life,
// and frames sent in the next 256 ms were judged host_only and forwarded to
// the other machine. Now a lapsed host view means no cached answer is
// trusted, and not one frame gets there.
func TestWithoutTheDaemonNoFrameReachesAnotherMachineAfterAnAddressLeavesTheHost(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 94})
	s.register(t, datapath.Policy{DefaultAction: datapath.ActionDeny}) // udp/53 is a host-only port
	const moved = "10.212.0.1"
	s.ns.IP(t, "addr", "add", moved+"/32", "dev", bridge)

	// The other machine, reached from the host through a veth.
	far := nettest.NewNS(t)
	s.ns.IP(t, "link", "add", "tofar", "type", "veth", "peer", "name", "fromhost", "netns", far.Name)
	s.ns.IP(t, "addr", "add", "10.213.0.1/30", "dev", "tofar")
	s.ns.IP(t, "link", "set", "tofar", "up")
	far.IP(t, "link", "set", "lo", "up")
	far.IP(t, "addr", "add", "10.213.0.2/30", "dev", "fromhost")
	far.IP(t, "link", "set", "fromhost", "up")
	far.IP(t, "addr", "add", moved+"/32", "dev", "lo")
	far.IP(t, "route", "add", "10.0.0.0/24", "via", "10.213.0.1")
	var sock *net.UDPConn
	if err := netns.Do(far.File, func() (err error) {
		sock, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(moved), Port: 53})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sock.Close() }()

	// The host's address: the lookup's answer, cached.
	if got := s.judge4(t, moved, 53); got != "map[host_only:1]" {
		t.Fatalf("udp/53 to the host's %s: counted %s, want host_only", moved, got)
	}
	// It leaves the host and routes away, and the VM keeps sending.
	s.ns.IP(t, "addr", "del", moved+"/32", "dev", bridge)
	s.ns.IP(t, "route", "add", moved+"/32", "via", "10.213.0.2")
	before := s.counts(t)
	frame := udp4(brMAC, vm4, moved, 40000, 53, ipv4Opts{})(nil)[0]
	const sent = 150
	for range sent {
		s.write(t, frame)
		time.Sleep(2 * time.Millisecond)
	}
	// Whatever got through is in the other machine's socket by now; a
	// second is long for a veth.
	arrived := 0
	buf := make([]byte, 2048)
	for {
		_ = sock.SetReadDeadline(time.Now().Add(time.Second))
		if _, _, err := sock.ReadFromUDP(buf); err != nil {
			break
		}
		arrived++
	}
	counted := s.counts(t).since(before)
	if arrived > 0 {
		t.Fatalf("%d of %d frames reached the other machine's udp/53 after the address left the host (counted %v): a stale answer judged them the host's", arrived, sent, counted)
	}
	if counted["deny"] != sent {
		t.Fatalf("counted %v, want all %d denied", counted, sent)
	}
}
