package datapath_test

// Builders of the Ethernet frames the frame tests and benchmarks write into a
// tap, as a tenant VM would. Checksums are real, so that a frame the program
// lets through is also accepted by the host's stack: delivery to a host socket
// is part of what the tests check.

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Ethertypes and IP protocols the builders know.
const (
	etIPv4   = 0x0800
	etARP    = 0x0806
	etIPv6   = 0x86dd
	et8021Q  = 0x8100
	et8021AD = 0x88a8

	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
	protoGRE    = 47

	v6HopByHop = 0
	v6Routing  = 43
	v6Fragment = 44
	v6DestOpts = 60
	v6NoNext   = 59
)

// vlanTag is one 802.1Q/802.1ad tag: its TPID and VLAN ID.
type vlanTag struct {
	tpid uint16
	vid  uint16
}

// eth returns an Ethernet header from src to dst with tags (outermost first)
// and ethertype, followed by payload, padded to the 60-byte minimum.
func eth(dst, src net.HardwareAddr, tags []vlanTag, ethertype uint16, payload []byte) []byte {
	b := make([]byte, 0, 14+4*len(tags)+len(payload)+46)
	b = append(b, dst...)
	b = append(b, src...)
	for _, t := range tags {
		b = binary.BigEndian.AppendUint16(b, t.tpid)
		b = binary.BigEndian.AppendUint16(b, t.vid)
	}
	b = binary.BigEndian.AppendUint16(b, ethertype)
	b = append(b, payload...)
	for len(b) < 60 {
		b = append(b, 0)
	}
	return b
}

// ipv4Opts are the knobs of an IPv4 header that cases turn.
type ipv4Opts struct {
	id       uint16
	more     bool   // more fragments
	offset   uint16 // fragment offset, in 8-byte units
	ihl      int    // header length in 32-bit words; 0: 5, plus options
	options  []byte // padded to a multiple of 4
	totalLen int    // 0: the real length; otherwise written as given
	ttl      uint8
}

// ipv4 returns an IPv4 packet from src to dst carrying payload as protocol.
func ipv4(src, dst string, proto uint8, payload []byte, o ipv4Opts) []byte {
	opts := append([]byte(nil), o.options...)
	for len(opts)%4 != 0 {
		opts = append(opts, 0)
	}
	hlen := 20 + len(opts)
	ihl := o.ihl
	if ihl == 0 {
		ihl = hlen / 4
	}
	h := make([]byte, hlen)
	h[0] = 0x40 | byte(ihl&0x0f)
	total := hlen + len(payload)
	if o.totalLen != 0 {
		total = o.totalLen
	}
	binary.BigEndian.PutUint16(h[2:4], uint16(total))
	binary.BigEndian.PutUint16(h[4:6], o.id)
	frag := o.offset & 0x1fff
	if o.more {
		frag |= 0x2000
	}
	binary.BigEndian.PutUint16(h[6:8], frag)
	h[8] = o.ttl
	if h[8] == 0 {
		h[8] = 64
	}
	h[9] = proto
	copy(h[12:16], netip.MustParseAddr(src).AsSlice())
	copy(h[16:20], netip.MustParseAddr(dst).AsSlice())
	copy(h[20:], opts)
	binary.BigEndian.PutUint16(h[10:12], checksum(h, 0))
	return append(h, payload...)
}

// v6Ext is one IPv6 extension header: its type and, for hop-by-hop,
// routing and destination options, the body after the first two bytes
// (padded to a multiple of 8 with the two); for a fragment header, the
// offset (8-byte units), the M flag and the identification.
type v6Ext struct {
	kind   uint8
	body   []byte
	offset uint16
	more   bool
	id     uint32
}

// ipv6 returns an IPv6 packet from src to dst whose chain is exts and then
// proto carrying payload. hopLimit 0 means 64.
func ipv6(src, dst string, exts []v6Ext, proto uint8, payload []byte, hopLimit uint8) []byte {
	var chain []byte
	for i, e := range exts {
		next := proto
		if i+1 < len(exts) {
			next = exts[i+1].kind
		}
		switch e.kind {
		case v6Fragment:
			f := make([]byte, 8)
			f[0] = next
			off := e.offset << 3
			if e.more {
				off |= 1
			}
			binary.BigEndian.PutUint16(f[2:4], off)
			binary.BigEndian.PutUint32(f[4:8], e.id)
			chain = append(chain, f...)
		default:
			body := append([]byte(nil), e.body...)
			for (len(body)+2)%8 != 0 {
				body = append(body, 0) // Pad1 options
			}
			chain = append(chain, next, byte((len(body)+2)/8-1))
			chain = append(chain, body...)
		}
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:6], uint16(len(chain)+len(payload)))
	h[6] = proto
	if len(exts) > 0 {
		h[6] = exts[0].kind
	}
	h[7] = hopLimit
	if h[7] == 0 {
		h[7] = 64
	}
	copy(h[8:24], netip.MustParseAddr(src).AsSlice())
	copy(h[24:40], netip.MustParseAddr(dst).AsSlice())
	return append(append(h, chain...), payload...)
}

// udp returns a UDP datagram whose checksum covers the pseudo-header of src
// and dst (their family picks IPv4 or IPv6).
func udp(src, dst string, sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint16(b[4:6], uint16(8+len(payload)))
	b = append(b, payload...)
	c := checksum(b, pseudo(src, dst, protoUDP, len(b)))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[6:8], c)
	return b
}

// tcpSYN returns a TCP SYN segment with a valid checksum.
func tcpSYN(src, dst string, sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint32(b[4:8], 1)
	b[12] = 5 << 4
	b[13] = 0x02
	binary.BigEndian.PutUint16(b[14:16], 65535)
	b = append(b, payload...)
	binary.BigEndian.PutUint16(b[16:18], checksum(b, pseudo(src, dst, protoTCP, len(b))))
	return b
}

// icmp4 returns an ICMP message of type and code with body.
func icmp4(typ, code uint8, body []byte) []byte {
	b := append([]byte{typ, code, 0, 0}, body...)
	binary.BigEndian.PutUint16(b[2:4], checksum(b, 0))
	return b
}

// icmp6 returns an ICMPv6 message from src to dst of type and code with body.
func icmp6(src, dst string, typ, code uint8, body []byte) []byte {
	b := append([]byte{typ, code, 0, 0}, body...)
	binary.BigEndian.PutUint16(b[2:4], checksum(b, pseudo(src, dst, protoICMPv6, len(b))))
	return b
}

// neighborSolicit returns the body of an ND neighbor solicitation (or, with
// na, advertisement) for target, with the sender's link-layer address
// option.
func neighborSolicit(target string, mac net.HardwareAddr, na bool) []byte {
	b := make([]byte, 4, 32)
	if na {
		b[0] = 0x20 // override
	}
	b = append(b, netip.MustParseAddr(target).AsSlice()...)
	opt := byte(1) // source link-layer address
	if na {
		opt = 2 // target link-layer address
	}
	b = append(b, opt, 1)
	return append(b, mac...)
}

// arp returns an ARP packet (op 1 request, 2 reply) from sha/spa about tpa.
func arp(op uint16, sha net.HardwareAddr, spa, tpa string) []byte {
	b := make([]byte, 8, 28)
	binary.BigEndian.PutUint16(b[0:2], 1)
	binary.BigEndian.PutUint16(b[2:4], etIPv4)
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:8], op)
	b = append(b, sha...)
	b = append(b, netip.MustParseAddr(spa).AsSlice()...)
	b = append(b, make([]byte, 6)...)
	return append(b, netip.MustParseAddr(tpa).AsSlice()...)
}

// pseudo sums the pseudo-header of an upper-layer checksum.
func pseudo(src, dst string, proto uint8, length int) uint32 {
	var sum uint32
	for _, a := range []string{src, dst} {
		b := netip.MustParseAddr(a).AsSlice()
		for i := 0; i < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	return sum + uint32(proto) + uint32(length)
}

// checksum is the Internet checksum of b on top of a partial sum.
func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// solicitedNode returns the solicited-node multicast address of a.
func solicitedNode(a string) string {
	b := netip.MustParseAddr(a).As16()
	m := [16]byte{0xff, 0x02, 10: 0, 11: 1, 12: 0xff}
	copy(m[13:], b[13:])
	return netip.AddrFrom16(m).String()
}

// multicastMAC returns the Ethernet address an IP multicast group maps to.
func multicastMAC(group string) net.HardwareAddr {
	a := netip.MustParseAddr(group)
	if a.Is4() {
		b := a.As4()
		return net.HardwareAddr{0x01, 0x00, 0x5e, b[1] & 0x7f, b[2], b[3]}
	}
	b := a.As16()
	return net.HardwareAddr{0x33, 0x33, b[12], b[13], b[14], b[15]}
}
