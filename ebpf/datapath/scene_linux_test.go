package datapath_test

// A tenant tap as production has it, in a private network namespace: a
// bridge stands in for the VRF (this VM has no VRF module), carrying the
// gateway addresses and another local address of the "VRF"; the tap is its
// port, registered through attachreg as CNI ADD registers it; a queue file
// of the tap is the VMM. Behind the bridge, the host's sockets and a packet
// socket on the bridge tell where each frame went.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/netns"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// Addresses of the scene. The VM is vm4/vm6; the host's gateway is gw4/gw6
// on the bridge, which also holds local4/local6 (another local address of
// the VRF) and the link-local brLL. far4/far6 are routed away from the host.
const (
	gw4    = "10.0.0.1"
	vm4    = "10.0.0.2"
	bcast4 = "10.0.0.255"
	local4 = "10.200.0.1"
	far4   = "10.9.9.9"
	gw6    = "fd00::1"
	vm6    = "fd00::2"
	local6 = "fd00:200::1"
	far6   = "fd00:9::9"
	brLL   = "fe80::fe"
	vmLL   = "fe80::2"
	bridge = "galbr0"
)

var (
	vmMAC    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	otherMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x03} // another VM's
	brMAC    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xfe}
	bcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
)

// hostPorts are the host-only ports every scene registers.
var hostPorts = []attachreg.ProtoPort{
	{Protocol: datapath.ProtocolUDP, Port: 53},
	{Protocol: datapath.ProtocolUDP, Port: 67},
	{Protocol: datapath.ProtocolUDP, Port: 547},
	{Protocol: datapath.ProtocolTCP, Port: 22},
}

// tenant is a scene's (VPC, attachment), in the datapath's own numbers.
type tenant struct {
	VPC        datapath.VPC
	Attachment datapath.Attachment
}

// TapName is the name of the tenant's tap; attachreg translates between
// the datapath's numbers and the tenant identities names carry.
func (n tenant) TapName() string { return attachreg.IdentityOf(n.VPC, n.Attachment).TapName() }

func (n tenant) key(d datapath.Decision) datapath.DecisionKey {
	return datapath.DecisionKey{VPC: n.VPC, Attachment: n.Attachment, Decision: d}
}

type tapScene struct {
	ns      *nettest.NS
	dp      *datapath.Datapath
	reg     *attachreg.Registry
	id      tenant
	name    string
	ifindex uint32
	brIndex int
	q       int // the VMM's queue, non-blocking
	pkt     int // packet socket on the bridge, non-blocking; -1 until listen
	socks   map[string]*net.UDPConn
}

// newTapScene builds the namespace, bridge and tap, and opens the VMM's
// queue. The tap is not registered: see register.
func newTapScene(t testing.TB, id tenant) *tapScene {
	t.Helper()
	nettest.RequireTCX(t) // the scene's program runs at the tap's TCX ingress
	ns := nettest.NewNS(t)
	// The node routes its tenants: forwarding is on, as on a production
	// node. DAD and router advertisements would only add delays and noise.
	nettest.Run(t, "ip", "netns", "exec", ns.Name, "sysctl", "-qw",
		"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
		"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
		"net.ipv6.conf.default.accept_ra=0", "net.ipv6.conf.default.router_solicitations=0")
	ns.IP(t, "link", "add", bridge, "address", brMAC.String(), "type", "bridge", "mcast_snooping", "0")
	for _, a := range []string{gw4 + "/24", local4 + "/32"} {
		ns.IP(t, "addr", "add", a, "dev", bridge)
	}
	for _, a := range []string{gw6 + "/64", local6 + "/128", brLL + "/64"} {
		ns.IP(t, "addr", "add", a, "dev", bridge, "nodad")
	}
	ns.IP(t, "link", "set", bridge, "up")
	ns.IP(t, "route", "add", "default", "via", "10.0.0.254", "dev", bridge)
	ns.IP(t, "-6", "route", "add", "default", "via", "fd00::fe", "dev", bridge)

	name := id.TapName()
	fd := newVMMTap(t, ns, name)
	c := ns.Dial(t)
	l, err := c.GetByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	br, err := c.GetByName(context.Background(), bridge)
	if err != nil {
		t.Fatal(err)
	}
	dp, err := datapath.Load(nettest.BPFFS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	return &tapScene{ns: ns, dp: dp, reg: attachreg.New(dp, ns.File, nil), id: id, name: name,
		ifindex: l.Index, brIndex: int(br.Index), q: fd, pkt: -1, socks: map[string]*net.UDPConn{}}
}

// newVMMTap makes the tap name, a port of the scene's bridge, and returns
// its VMM's queue, non-blocking.
func newVMMTap(t testing.TB, ns *nettest.NS, name string) int {
	t.Helper()
	nettest.NewTap(t, ns, name, tun.Mode{})
	q, err := tun.Open(ns.File, name, tun.Mode{})
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(q.Fd()))
	q.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	ns.IP(t, "link", "set", name, "master", bridge, "up")
	return fd
}

// registration is what CNI ADD would register for the scene's tap under
// policy.
func (s *tapScene) registration(policy datapath.Policy) attachreg.Registration {
	return attachreg.Registration{
		Identity: attachreg.IdentityOf(s.id.VPC, s.id.Attachment), Table: 1062, Egress: datapath.EgressTap, Policy: policy,
		Gateway:       datapath.Gateway{IPv4: netip.MustParseAddr(gw4), IPv6: netip.MustParseAddr(gw6)},
		HostOnlyPorts: hostPorts,
		MAC:           vmMAC,
		Addresses:     []netip.Prefix{netip.MustParsePrefix(vm4 + "/32"), netip.MustParsePrefix(vm6 + "/128")},
	}
}

// rules is the tap_rules row attachreg writes for registration(policy).
func (s *tapScene) rules(policy datapath.Policy) datapath.Rules {
	return s.registration(policy).Rules(s.ifindex)
}

func (s *tapScene) register(t testing.TB, policy datapath.Policy) {
	t.Helper()
	if err := s.reg.RegisterInterface(context.Background(), s.ifindex, s.registration(policy)); err != nil {
		t.Fatal(err)
	}
}

// listen opens the host's sockets (UDP on listed and unlisted ports, both
// families, the DHCPv6 servers' group joined) and the packet socket on the
// bridge.
func (s *tapScene) listen(t testing.TB) {
	t.Helper()
	err := netns.Do(s.ns.File, func() error {
		for _, a := range []string{"udp4:0.0.0.0:9999", "udp6:[::]:9999", "udp4:0.0.0.0:53", "udp6:[::]:53",
			"udp4:0.0.0.0:67", "udp6:[::]:547"} {
			network, addr, _ := strings.Cut(a, ":")
			ua, err := net.ResolveUDPAddr(network, addr)
			if err != nil {
				return err
			}
			c, err := net.ListenUDP(network, ua)
			if err != nil {
				return err
			}
			s.socks[network+":"+addr[strings.LastIndex(addr, ":")+1:]] = c
		}
		// A DHCPv6 server joins All_DHCP_Relay_Agents_and_Servers.
		raw, err := s.socks["udp6:547"].SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			mreq := &unix.IPv6Mreq{Interface: uint32(s.brIndex)}
			copy(mreq.Multiaddr[:], netip.MustParseAddr("ff02::1:2").AsSlice())
			serr = unix.SetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, mreq)
		}); err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		s.pkt = fd
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: s.brIndex})
	})
	t.Cleanup(func() {
		for _, c := range s.socks {
			_ = c.Close()
		}
		if s.pkt >= 0 {
			unix.Close(s.pkt)
		}
	})
	if err != nil {
		t.Fatalf("host sockets: %v", err)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// write writes frames into the tap as the VMM does.
func (s *tapScene) write(t testing.TB, frames ...[]byte) {
	t.Helper()
	writeFd(t, s.q, frames...)
}

// writeFd writes frames into a tap queue.
func writeFd(t testing.TB, fd int, frames ...[]byte) {
	t.Helper()
	for _, f := range frames {
		if _, err := unix.Write(fd, f); err != nil {
			t.Fatalf("write %d-byte frame into the tap: %v", len(f), err)
		}
	}
}

// delivery is where a marked frame went: the bridge (the packet socket saw
// it arrive) and the host sockets that received it.
type delivery struct {
	bridge bool
	socks  []string
}

// collectUntil drains the packet socket and the host sockets until marker
// was seen where want says or wait passed, and says where it was seen.
// Frames leaving the bridge (the host's replies, which may quote the
// marker) are not counted.
func (s *tapScene) collectUntil(marker []byte, wait time.Duration, want delivery) delivery {
	var d delivery
	deadline := time.Now().Add(wait)
	buf := make([]byte, 65536)
	seen := map[string]bool{}
	for {
		for {
			n, from, err := unix.Recvfrom(s.pkt, buf, 0)
			if err != nil {
				break
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			if contains(buf[:n], marker) {
				d.bridge = true
			}
		}
		for name, c := range s.socks {
			_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
			for {
				n, err := c.Read(buf)
				if err != nil {
					break
				}
				if contains(buf[:n], marker) && !seen[name] {
					seen[name] = true
					d.socks = append(d.socks, name)
				}
			}
		}
		slices.Sort(d.socks)
		if time.Now().After(deadline) || (d.bridge == want.bridge && slices.Equal(d.socks, want.socks)) {
			return d
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func contains(b, sub []byte) bool { return len(sub) > 0 && strings.Contains(string(b), string(sub)) }

// counts is a snapshot of every counter the program keeps for the scene's
// identity and of the unattributed counters.
type counts struct {
	decisions    map[datapath.Decision]uint64
	unattributed map[datapath.Reason]uint64
}

// Decisions and reasons the counters are read for.
var (
	allDecisions = []datapath.Decision{datapath.DecisionAllow, datapath.DecisionDeny, datapath.DecisionHostOnly,
		datapath.DecisionMalformed, datapath.DecisionSpoofed}
	allReasons = []datapath.Reason{datapath.ReasonPolicyUnavailable, datapath.ReasonIdentityUnavailable, datapath.ReasonDecisionsFull}
)

func (s *tapScene) counts(t testing.TB) counts {
	t.Helper()
	c := counts{decisions: map[datapath.Decision]uint64{}, unattributed: map[datapath.Reason]uint64{}}
	for _, d := range allDecisions {
		n, err := s.dp.Decisions.Get(s.id.key(d))
		if err != nil && !isNotExist(err) {
			t.Fatal(err)
		}
		c.decisions[d] = n
	}
	for _, r := range allReasons {
		n, err := s.dp.Unattributed.Get(r)
		if err != nil {
			t.Fatal(err)
		}
		c.unattributed[r] = n
	}
	return c
}

// since returns the counters that changed since before, by name.
func (c counts) since(before counts) map[string]uint64 {
	out := map[string]uint64{}
	for d, n := range c.decisions {
		if n != before.decisions[d] {
			out[d.String()] = n - before.decisions[d]
		}
	}
	for r, n := range c.unattributed {
		if n != before.unattributed[r] {
			out["unattributed:"+r.String()] = n - before.unattributed[r]
		}
	}
	return out
}

func isNotExist(err error) bool { return errors.Is(err, ebpf.ErrKeyNotExist) }

func netipMust(a string) netip.Addr { return netip.MustParseAddr(a) }

func (n tenant) identity() identity.Identity { return attachreg.IdentityOf(n.VPC, n.Attachment) }

func hostPort(p datapath.Protocol, port uint16) attachreg.ProtoPort {
	return attachreg.ProtoPort{Protocol: p, Port: port}
}
