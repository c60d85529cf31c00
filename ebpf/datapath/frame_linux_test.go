package datapath_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
)

// rule is the documented rule (docs/datapath.md) a frame falls under.
type rule int

const (
	// ruleHostPort: TCP or UDP to the host: host_only on a listed port,
	// deny otherwise, whatever the default action.
	ruleHostPort rule = iota
	// ruleElsewhere: to an address the host forwards: the default action.
	ruleElsewhere
	// ruleLink: ARP, or ND (solicitation, advertisement, router
	// solicitation) to the host: host_only, whatever the default action.
	ruleLink
	// ruleICMPToHost: other ICMP to the host: the default action.
	ruleICMPToHost
	// ruleOtherToHost: any other protocol to the host: deny.
	ruleOtherToHost
	// ruleAlways: the same decision under every policy (malformed frames,
	// stacked tags, fragments whose first fragment was not seen).
	ruleAlways
	// ruleSpoofed: spoofed, under every policy whose ethertype list lets
	// the frame in (anti-spoofing comes after that list, before the rest).
	ruleSpoofed
)

// frameCase is one frame (or a fragmented datagram) a VM writes, the rule it
// falls under, and where it goes when the program passes it.
type frameCase struct {
	name      string
	issue     int // the case of issue 21 it guards; 0: what held before
	frames    func(m []byte) [][]byte
	rule      rule
	ethertype uint16            // the ethertype it is judged as (after the tag the kernel strips)
	proto     uint8             // the upper-layer protocol it is judged as
	listed    bool              // ruleHostPort: the port is a host-only port
	fixed     datapath.Decision // ruleAlways
	sock      string            // the host socket that receives it when it passes
}

// profile is a policy a tenant may have; the frame test runs every case
// under each.
type profile struct {
	name   string
	policy datapath.Policy
}

var profiles = []profile{
	{"allow", datapath.Policy{DefaultAction: datapath.ActionAllow}},
	{"deny", datapath.Policy{DefaultAction: datapath.ActionDeny}},
	{"allow-tcp-udp", datapath.Policy{DefaultAction: datapath.ActionAllow, Protocols: []datapath.Protocol{protoTCP, protoUDP}}},
	// The README's example policy.
	{"readme", datapath.Policy{DefaultAction: datapath.ActionAllow,
		Ethertypes: []uint16{etIPv4, etARP, etIPv6}, Protocols: []datapath.Protocol{protoICMP, protoTCP, protoUDP, protoICMPv6}}},
	{"deny-ip-tcp-udp", datapath.Policy{DefaultAction: datapath.ActionDeny,
		Ethertypes: []uint16{etIPv4, etIPv6}, Protocols: []datapath.Protocol{protoTCP, protoUDP}}},
}

// want is the decision the documented rules give c under p.
func (p profile) want(c frameCase) datapath.Decision {
	if c.rule == ruleAlways {
		return c.fixed
	}
	pol := p.policy
	if len(pol.Ethertypes) > 0 && !slices.Contains(pol.Ethertypes, c.ethertype) {
		return datapath.DecisionDeny
	}
	if c.rule == ruleSpoofed {
		return datapath.DecisionSpoofed
	}
	if (c.ethertype == etIPv4 || c.ethertype == etIPv6) && len(pol.Protocols) > 0 && !slices.Contains(pol.Protocols, datapath.Protocol(c.proto)) {
		return datapath.DecisionDeny
	}
	defaultDecision := datapath.DecisionAllow
	if pol.DefaultAction == datapath.ActionDeny {
		defaultDecision = datapath.DecisionDeny
	}
	switch c.rule {
	case ruleHostPort:
		if c.listed {
			return datapath.DecisionHostOnly
		}
		return datapath.DecisionDeny
	case ruleLink:
		return datapath.DecisionHostOnly
	case ruleOtherToHost:
		return datapath.DecisionDeny
	}
	return defaultDecision
}

// payload is a UDP or ICMP payload carrying the marker.
func payload(m []byte) []byte { return append(append([]byte(nil), m...), make([]byte, 24)...) }

func one(f []byte) [][]byte { return [][]byte{f} }

func udp4(dstMAC []byte, src, dst string, sport, dport uint16, o ipv4Opts) func(m []byte) [][]byte {
	return func(m []byte) [][]byte {
		return one(eth(dstMAC, vmMAC, nil, etIPv4, ipv4(src, dst, protoUDP, udp(src, dst, sport, dport, payload(m)), o)))
	}
}

func udp6(dstMAC []byte, src, dst string, exts []v6Ext, sport, dport uint16) func(m []byte) [][]byte {
	return func(m []byte) [][]byte {
		return one(eth(dstMAC, vmMAC, nil, etIPv6, ipv6(src, dst, exts, protoUDP, udp(src, dst, sport, dport, payload(m)), 0)))
	}
}

// tagged is a frame with VLAN tags in front of an IP packet.
func tagged(tags []vlanTag, ethertype uint16, pkt func(m []byte) []byte) func(m []byte) [][]byte {
	return func(m []byte) [][]byte { return one(eth(brMAC, vmMAC, tags, ethertype, pkt(m))) }
}

// fragments4 splits a UDP datagram from vm4 to dst:dport into two IPv4
// fragments, the first carrying the UDP header and 24 bytes.
func fragments4(dst string, dport uint16) func(m []byte) [][]byte {
	return func(m []byte) [][]byte {
		d := udp(vm4, dst, 40000, dport, append(payload(m), payload(m)...))
		return [][]byte{
			eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, dst, protoUDP, d[:32], ipv4Opts{id: 7, more: true})),
			eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, dst, protoUDP, d[32:], ipv4Opts{id: 7, offset: 4})),
		}
	}
}

// fragments6 is fragments4 for IPv6, through a fragment header.
func fragments6(dst string, dport uint16) func(m []byte) [][]byte {
	return func(m []byte) [][]byte {
		d := udp(vm6, dst, 40000, dport, append(payload(m), payload(m)...))
		return [][]byte{
			eth(brMAC, vmMAC, nil, etIPv6, ipv6(vm6, dst, []v6Ext{{kind: v6Fragment, more: true, id: 7}}, protoUDP, d[:32], 0)),
			eth(brMAC, vmMAC, nil, etIPv6, ipv6(vm6, dst, []v6Ext{{kind: v6Fragment, offset: 4, id: 7}}, protoUDP, d[32:], 0)),
		}
	}
}

func destOpts(n int) []v6Ext {
	exts := make([]v6Ext, n)
	for i := range exts {
		exts[i] = v6Ext{kind: v6DestOpts}
	}
	return exts
}

var (
	udpGw4    = func(port uint16) func(m []byte) []byte { return udpPkt4(gw4, port) }
	udpGw6    = func(port uint16) func(m []byte) []byte { return udpPkt6(gw6, port) }
	icmpEcho4 = func(dst string) func(m []byte) []byte {
		return func(m []byte) []byte {
			return ipv4(vm4, dst, protoICMP, icmp4(8, 0, append([]byte{0, 1, 0, 1}, payload(m)...)), ipv4Opts{})
		}
	}
)

func udpPkt4(dst string, port uint16) func(m []byte) []byte {
	return func(m []byte) []byte {
		return ipv4(vm4, dst, protoUDP, udp(vm4, dst, 40000, port, payload(m)), ipv4Opts{})
	}
}

func udpPkt6(dst string, port uint16) func(m []byte) []byte {
	return func(m []byte) []byte { return ipv6(vm6, dst, nil, protoUDP, udp(vm6, dst, 40000, port, payload(m)), 0) }
}

// frameCases is every case of issue 21 that a frame can show, in both
// families, and the basics that held before.
func frameCases() []frameCase {
	allNodes := multicastMAC("ff02::1")
	host := func(c frameCase, listed bool, sock string) frameCase {
		c.rule, c.listed, c.sock = ruleHostPort, listed, sock
		return c
	}
	always := func(c frameCase, d datapath.Decision) frameCase {
		c.rule, c.fixed = ruleAlways, d
		return c
	}
	spoofed := func(c frameCase) frameCase { c.rule = ruleSpoofed; return c }
	v4 := func(name string, issue int, f func(m []byte) [][]byte, proto uint8) frameCase {
		return frameCase{name: name, issue: issue, frames: f, ethertype: etIPv4, proto: proto}
	}
	v6 := func(name string, issue int, f func(m []byte) [][]byte, proto uint8) frameCase {
		return frameCase{name: name, issue: issue, frames: f, ethertype: etIPv6, proto: proto}
	}
	elsewhere := func(c frameCase) frameCase { c.rule = ruleElsewhere; return c }
	icmpToHost := func(c frameCase) frameCase { c.rule = ruleICMPToHost; return c }
	link := func(c frameCase) frameCase { c.rule = ruleLink; return c }
	raw := func(f func(m []byte) []byte) func(m []byte) [][]byte {
		return func(m []byte) [][]byte { return one(f(m)) }
	}
	malformed4 := func(name string, f func(m []byte) []byte) frameCase {
		return always(v4(name, 4, raw(f), protoUDP), datapath.DecisionMalformed)
	}

	return []frameCase{
		// What held before issue 21.
		host(v4("udp4 to a listed gateway port", 0, udp4(brMAC, vm4, gw4, 40000, 53, ipv4Opts{}), protoUDP), true, "udp4:53"),
		host(v4("udp4 to an unlisted gateway port", 0, udp4(brMAC, vm4, gw4, 40000, 9999, ipv4Opts{}), protoUDP), false, "udp4:9999"),
		host(v6("udp6 to a listed gateway port", 0, udp6(brMAC, vm6, gw6, nil, 40000, 53), protoUDP), true, "udp6:53"),
		host(v6("udp6 to an unlisted gateway port", 0, udp6(brMAC, vm6, gw6, nil, 40000, 9999), protoUDP), false, "udp6:9999"),
		host(v4("tcp4 to a listed gateway port", 0, func(m []byte) [][]byte {
			return one(eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, gw4, protoTCP, tcpSYN(vm4, gw4, 40000, 22, m), ipv4Opts{})))
		}, protoTCP), true, ""),
		host(v4("udp4 with IP options to a listed gateway port", 0, udp4(brMAC, vm4, gw4, 40000, 53, ipv4Opts{options: []byte{1, 1, 1, 1}}), protoUDP), true, "udp4:53"),
		elsewhere(v4("udp4 elsewhere", 0, udp4(brMAC, vm4, far4, 40000, 9999, ipv4Opts{}), protoUDP)),
		elsewhere(v6("udp6 elsewhere", 0, udp6(brMAC, vm6, far6, nil, 40000, 9999), protoUDP)),
		elsewhere(v4("icmp4 echo elsewhere", 0, tagged(nil, etIPv4, icmpEcho4(far4)), protoICMP)),

		// 1. IPv6 extension headers.
		host(v6("hop-by-hop, udp6 to an unlisted gateway port", 1, udp6(brMAC, vm6, gw6, []v6Ext{{kind: v6HopByHop}}, 40000, 9999), protoUDP), false, "udp6:9999"),
		host(v6("destination options, udp6 to an unlisted gateway port", 1, udp6(brMAC, vm6, gw6, []v6Ext{{kind: v6DestOpts}}, 40000, 9999), protoUDP), false, "udp6:9999"),
		host(v6("atomic fragment, udp6 to an unlisted gateway port", 1, udp6(brMAC, vm6, gw6, []v6Ext{{kind: v6Fragment, id: 3}}, 40000, 9999), protoUDP), false, "udp6:9999"),
		host(v6("routing header, udp6 to an unlisted gateway port", 1, udp6(brMAC, vm6, gw6, []v6Ext{{kind: v6Routing, body: []byte{0, 0}}}, 40000, 9999), protoUDP), false, "udp6:9999"),
		host(v6("hop-by-hop and destination options, udp6 to a listed gateway port", 1, udp6(brMAC, vm6, gw6, []v6Ext{{kind: v6HopByHop}, {kind: v6DestOpts}}, 40000, 53), protoUDP), true, "udp6:53"),
		elsewhere(v6("hop-by-hop, udp6 elsewhere", 1, udp6(brMAC, vm6, far6, []v6Ext{{kind: v6HopByHop}}, 40000, 9999), protoUDP)),
		host(v6("fragmented udp6 to a listed gateway port", 1, fragments6(gw6, 53), protoUDP), true, "udp6:53"),
		host(v6("fragmented udp6 to an unlisted gateway port", 1, fragments6(gw6, 9999), protoUDP), false, "udp6:9999"),
		always(v6("a chain of 9 extension headers, udp6 to a listed gateway port", 1, udp6(brMAC, vm6, gw6, destOpts(9), 40000, 53), protoUDP), datapath.DecisionMalformed),
		always(v6("an extension header longer than the packet", 1, func(m []byte) [][]byte {
			p := ipv6(vm6, gw6, []v6Ext{{kind: v6DestOpts}}, protoUDP, udp(vm6, gw6, 40000, 53, payload(m)), 0)
			p[41] = 200 // header length: 201 * 8 bytes
			return one(eth(brMAC, vmMAC, nil, etIPv6, p))
		}, protoUDP), datapath.DecisionMalformed),
		elsewhere(v6("no next header after hop-by-hop, elsewhere", 1, func(m []byte) [][]byte {
			return one(eth(brMAC, vmMAC, nil, etIPv6, ipv6(vm6, far6, []v6Ext{{kind: v6HopByHop}}, v6NoNext, payload(m), 0)))
		}, v6NoNext)),

		// 2. Stacked VLAN tags.
		always(v4("802.1Q in 802.1Q, udp4 to an unlisted gateway port", 2, tagged([]vlanTag{{et8021Q, 5}, {et8021Q, 7}}, etIPv4, udpGw4(9999)), protoUDP), datapath.DecisionDeny),
		always(v6("802.1Q in 802.1ad, udp6 to an unlisted gateway port", 2, tagged([]vlanTag{{et8021AD, 5}, {et8021Q, 7}}, etIPv6, udpGw6(9999)), protoUDP), datapath.DecisionDeny),
		always(v4("two VLAN 0 tags, udp4 to an unlisted gateway port", 2, tagged([]vlanTag{{et8021Q, 0}, {et8021Q, 0}}, etIPv4, udpGw4(9999)), protoUDP), datapath.DecisionDeny),
		always(v6("two VLAN 0 tags, udp6 to an unlisted gateway port", 2, tagged([]vlanTag{{et8021Q, 0}, {et8021Q, 0}}, etIPv6, udpGw6(9999)), protoUDP), datapath.DecisionDeny),
		always(v4("QinQ 5/7, icmp4 echo elsewhere", 2, tagged([]vlanTag{{et8021AD, 5}, {et8021Q, 7}}, etIPv4, icmpEcho4(far4)), protoICMP), datapath.DecisionDeny),
		host(v4("one VLAN 0 tag, udp4 to a listed gateway port", 2, tagged([]vlanTag{{et8021Q, 0}}, etIPv4, udpGw4(53)), protoUDP), true, "udp4:53"),
		host(v6("one VLAN 0 tag, udp6 to an unlisted gateway port", 2, tagged([]vlanTag{{et8021Q, 0}}, etIPv6, udpGw6(9999)), protoUDP), false, "udp6:9999"),

		// 3. Every address that delivers to the host.
		host(v4("udp4 to the subnet broadcast, unlisted port", 3, udp4(bcastMAC, vm4, bcast4, 40000, 9999, ipv4Opts{}), protoUDP), false, "udp4:9999"),
		host(v4("udp4 to 255.255.255.255, unlisted port", 3, udp4(bcastMAC, vm4, "255.255.255.255", 40000, 9999, ipv4Opts{}), protoUDP), false, "udp4:9999"),
		host(v4("udp4 to 224.0.0.1, unlisted port", 3, udp4(multicastMAC("224.0.0.1"), vm4, "224.0.0.1", 40000, 9999, ipv4Opts{}), protoUDP), false, "udp4:9999"),
		host(v4("udp4 to another local address, unlisted port", 3, udp4(brMAC, vm4, local4, 40000, 9999, ipv4Opts{}), protoUDP), false, "udp4:9999"),
		host(v4("udp4 to another local address, listed port", 3, udp4(brMAC, vm4, local4, 40000, 53, ipv4Opts{}), protoUDP), true, "udp4:53"),
		host(v6("udp6 to ff02::1, unlisted port", 3, udp6(allNodes, vmLL, "ff02::1", nil, 40000, 9999), protoUDP), false, "udp6:9999"),
		host(v6("udp6 to the host's link-local address, unlisted port", 3, udp6(brMAC, vmLL, brLL, nil, 40000, 9999), protoUDP), false, "udp6:9999"),
		host(v6("udp6 to another local address, unlisted port", 3, udp6(brMAC, vm6, local6, nil, 40000, 9999), protoUDP), false, "udp6:9999"),
		host(v4("DHCP discover to udp/67", 3, udp4(bcastMAC, "0.0.0.0", "255.255.255.255", 68, 67, ipv4Opts{}), protoUDP), true, "udp4:67"),
		host(v6("DHCPv6 solicit to udp/547", 3, udp6(multicastMAC("ff02::1:2"), vmLL, "ff02::1:2", nil, 546, 547), protoUDP), true, "udp6:547"),
		icmpToHost(v4("icmp4 echo to the gateway", 3, tagged(nil, etIPv4, icmpEcho4(gw4)), protoICMP)),
		icmpToHost(v6("icmp6 echo to the gateway", 3, func(m []byte) [][]byte {
			return one(eth(brMAC, vmMAC, nil, etIPv6, ipv6(vm6, gw6, nil, protoICMPv6, icmp6(vm6, gw6, 128, 0, append([]byte{0, 1, 0, 1}, payload(m)...)), 0)))
		}, protoICMPv6)),
		func() frameCase {
			c := v4("GRE to the gateway", 3, func(m []byte) [][]byte {
				return one(eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, gw4, protoGRE, append([]byte{0, 0, 0x08, 0}, payload(m)...), ipv4Opts{})))
			}, protoGRE)
			c.rule = ruleOtherToHost
			return c
		}(),

		// 4. Fragments and malformed IPv4.
		host(v4("fragmented udp4 to a listed gateway port", 4, fragments4(gw4, 53), protoUDP), true, "udp4:53"),
		host(v4("fragmented udp4 to an unlisted gateway port", 4, fragments4(gw4, 9999), protoUDP), false, "udp4:9999"),
		elsewhere(v4("fragmented udp4 elsewhere", 4, fragments4(far4, 9999), protoUDP)),
		always(v4("a second udp4 fragment alone, its payload reading as a listed port", 4, func(m []byte) [][]byte {
			pl := append([]byte{0x9c, 0x40, 0, 53}, payload(m)...)
			return one(eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, gw4, protoUDP, pl, ipv4Opts{id: 9, offset: 4})))
		}, protoUDP), datapath.DecisionDeny),
		always(v6("a second udp6 fragment alone, its payload reading as a listed port", 4, func(m []byte) [][]byte {
			pl := append([]byte{0x9c, 0x40, 0, 53}, payload(m)...)
			return one(eth(brMAC, vmMAC, nil, etIPv6, ipv6(vm6, gw6, []v6Ext{{kind: v6Fragment, offset: 4, id: 9}}, protoUDP, pl, 0)))
		}, protoUDP), datapath.DecisionDeny),
		malformed4("IPv4 header length below 5 words", func(m []byte) []byte {
			return eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, gw4, protoUDP, udp(vm4, gw4, 40000, 53, payload(m)), ipv4Opts{ihl: 4}))
		}),
		malformed4("IPv4 total length beyond the frame", func(m []byte) []byte {
			return eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, gw4, protoUDP, udp(vm4, gw4, 40000, 53, payload(m)), ipv4Opts{totalLen: 1400}))
		}),
		malformed4("IPv4 total length shorter than its header", func(m []byte) []byte {
			return eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, gw4, protoUDP, udp(vm4, gw4, 40000, 53, payload(m)), ipv4Opts{totalLen: 16}))
		}),
		malformed4("IPv4 header longer than the packet", func(m []byte) []byte {
			return eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, gw4, protoUDP, m, ipv4Opts{ihl: 15}))
		}),
		malformed4("IPv4 first fragment too short for the ports", func(m []byte) []byte {
			return eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, gw4, protoUDP, []byte{0x9c}, ipv4Opts{id: 11, more: true}))
		}),
		always(v6("IPv6 payload length beyond the frame", 4, func(m []byte) [][]byte {
			p := udpPkt6(gw6, 53)(m)
			p[4], p[5] = 0x05, 0x00
			return one(eth(brMAC, vmMAC, nil, etIPv6, p))
		}, protoUDP), datapath.DecisionMalformed),

		// 7. Link resolution and anti-spoofing.
		func() frameCase {
			c := link(frameCase{name: "ARP request for the gateway", issue: 7, ethertype: etARP})
			c.frames = func(m []byte) [][]byte {
				return one(eth(bcastMAC, vmMAC, nil, etARP, append(arp(1, vmMAC, vm4, gw4), m...)))
			}
			return c
		}(),
		link(v6("neighbor solicitation for the gateway", 7, func(m []byte) [][]byte {
			sn := solicitedNode(gw6)
			return one(eth(multicastMAC(sn), vmMAC, nil, etIPv6, ipv6(vm6, sn, nil, protoICMPv6, icmp6(vm6, sn, 135, 0, append(neighborSolicit(gw6, vmMAC, false), m...)), 255)))
		}, protoICMPv6)),
		spoofed(frameCase{name: "ARP claiming the gateway's address", issue: 7, ethertype: etARP, frames: func(m []byte) [][]byte {
			return one(eth(bcastMAC, vmMAC, nil, etARP, append(arp(2, vmMAC, gw4, gw4), m...)))
		}}),
		spoofed(frameCase{name: "ARP whose sender is not the frame's source", issue: 7, ethertype: etARP, frames: func(m []byte) [][]byte {
			return one(eth(bcastMAC, vmMAC, nil, etARP, append(arp(1, brMAC, vm4, gw4), m...)))
		}}),
		spoofed(v6("neighbor advertisement claiming the gateway's address", 7, func(m []byte) [][]byte {
			return one(eth(allNodes, vmMAC, nil, etIPv6, ipv6(vm6, "ff02::1", nil, protoICMPv6, icmp6(vm6, "ff02::1", 136, 0, append(neighborSolicit(gw6, vmMAC, true), m...)), 255)))
		}, protoICMPv6)),
		spoofed(v6("router advertisement", 7, func(m []byte) [][]byte {
			body := append([]byte{64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0}, m...)
			return one(eth(allNodes, vmMAC, nil, etIPv6, ipv6(vmLL, "ff02::1", nil, protoICMPv6, icmp6(vmLL, "ff02::1", 134, 0, body), 255)))
		}, protoICMPv6)),
		spoofed(v6("ICMPv6 redirect", 7, func(m []byte) [][]byte {
			body := append(append(append([]byte{0, 0, 0, 0}, netipBytes(vmLL)...), netipBytes(far6)...), m...)
			return one(eth(brMAC, vmMAC, nil, etIPv6, ipv6(vmLL, brLL, nil, protoICMPv6, icmp6(vmLL, brLL, 137, 0, body), 255)))
		}, protoICMPv6)),
		spoofed(v4("ICMP redirect", 7, func(m []byte) [][]byte {
			return one(eth(brMAC, vmMAC, nil, etIPv4, ipv4(vm4, gw4, protoICMP, icmp4(5, 1, append(netipBytes(vm4), m...)), ipv4Opts{})))
		}, protoICMP)),
		spoofed(v4("DHCP offer from the VM", 7, udp4(bcastMAC, vm4, "255.255.255.255", 67, 68, ipv4Opts{}), protoUDP)),
		spoofed(v6("DHCPv6 advertise from the VM", 7, udp6(brMAC, vmLL, brLL, nil, 547, 546), protoUDP)),
		spoofed(v4("udp4 from the gateway's address", 7, udp4(brMAC, gw4, far4, 40000, 9999, ipv4Opts{}), protoUDP)),
		spoofed(v6("udp6 from the gateway's address", 7, udp6(brMAC, gw6, far6, nil, 40000, 9999), protoUDP)),
		spoofed(v4("udp4 from a multicast source", 7, udp4(brMAC, "224.0.0.9", far4, 40000, 9999, ipv4Opts{}), protoUDP)),
		spoofed(v4("a multicast source MAC", 7, func(m []byte) [][]byte {
			return one(eth(brMAC, multicastMAC("224.0.0.9"), nil, etIPv4, udpPkt4(far4, 9999)(m)))
		}, protoUDP)),

		// Issue 29, 5: the attachment's own MAC and addresses.
		spoofed(v4("a unicast source MAC that is not the VM's", 29, func(m []byte) [][]byte {
			return one(eth(brMAC, otherMAC, nil, etIPv4, udpPkt4(far4, 9999)(m)))
		}, protoUDP)),
		spoofed(v4("udp4 from another address of the subnet", 29, udp4(brMAC, "10.0.0.3", far4, 40000, 9999, ipv4Opts{}), protoUDP)),
		spoofed(v4("udp4 from the host's other address", 29, udp4(brMAC, local4, far4, 40000, 9999, ipv4Opts{}), protoUDP)),
		spoofed(v6("udp6 from another address of the subnet", 29, udp6(brMAC, "fd00::3", far6, nil, 40000, 9999), protoUDP)),
		spoofed(v6("udp6 from the host's other address", 29, udp6(brMAC, local6, far6, nil, 40000, 9999), protoUDP)),
		spoofed(v4("a later udp4 fragment from another address", 29, func(m []byte) [][]byte {
			pl := append([]byte{0x9c, 0x40, 0, 53}, payload(m)...)
			return one(eth(brMAC, vmMAC, nil, etIPv4, ipv4("10.0.0.3", far4, protoUDP, pl, ipv4Opts{id: 9, offset: 4})))
		}, protoUDP)),
		spoofed(frameCase{name: "ARP claiming another VM's address", issue: 29, ethertype: etARP, frames: func(m []byte) [][]byte {
			return one(eth(bcastMAC, vmMAC, nil, etARP, append(arp(2, vmMAC, "10.0.0.3", gw4), m...)))
		}}),
		spoofed(frameCase{name: "ARP from another MAC, sender and frame alike", issue: 29, ethertype: etARP, frames: func(m []byte) [][]byte {
			return one(eth(bcastMAC, otherMAC, nil, etARP, append(arp(1, otherMAC, vm4, gw4), m...)))
		}}),
		func() frameCase {
			c := link(frameCase{name: "ARP probe from 0.0.0.0", issue: 29, ethertype: etARP})
			c.frames = func(m []byte) [][]byte {
				return one(eth(bcastMAC, vmMAC, nil, etARP, append(arp(1, vmMAC, "0.0.0.0", vm4), m...)))
			}
			return c
		}(),
		spoofed(v6("neighbor advertisement for the host's other address", 29, func(m []byte) [][]byte {
			return one(eth(allNodes, vmMAC, nil, etIPv6, ipv6(vm6, "ff02::1", nil, protoICMPv6, icmp6(vm6, "ff02::1", 136, 0, append(neighborSolicit(local6, vmMAC, true), m...)), 255)))
		}, protoICMPv6)),
		link(v6("neighbor advertisement for the VM's own address", 29, func(m []byte) [][]byte {
			return one(eth(allNodes, vmMAC, nil, etIPv6, ipv6(vm6, "ff02::1", nil, protoICMPv6, icmp6(vm6, "ff02::1", 136, 0, append(neighborSolicit(vm6, vmMAC, true), m...)), 255)))
		}, protoICMPv6)),
		link(v6("duplicate address detection from ::", 29, func(m []byte) [][]byte {
			sn := solicitedNode(vm6)
			return one(eth(multicastMAC(sn), vmMAC, nil, etIPv6, ipv6("::", sn, nil, protoICMPv6, icmp6("::", sn, 135, 0, append(neighborSolicit(vm6, vmMAC, false)[:20], m...)), 255)))
		}, protoICMPv6)),
		spoofed(v4("udp4 from 0.0.0.0 that is no DHCP discovery", 29, udp4(bcastMAC, "0.0.0.0", "255.255.255.255", 40000, 53, ipv4Opts{}), protoUDP)),
		spoofed(v4("a DHCP reply from another source port", 29, udp4(brMAC, vm4, far4, 1067, 68, ipv4Opts{}), protoUDP)),
		spoofed(v6("a DHCPv6 reply from another source port", 29, udp6(brMAC, vm6, far6, nil, 1547, 546), protoUDP)),
	}
}

func netipBytes(a string) []byte { return netipMust(a).AsSlice() }

// TestFramesFollowTheDocumentedRules writes every case into a registered tap
// under every policy profile and checks the counters the program kept and
// where the frame went: the bridge (a packet socket) and the host's sockets.
func TestFramesFollowTheDocumentedRules(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 70})
	s.listen(t)
	cases := frameCases()
	for pi, p := range profiles {
		t.Run(p.name, func(t *testing.T) {
			pol := p.policy
			pol.Generation = uint64(pi + 1)
			s.register(t, pol)
			for ci, c := range cases {
				marker := fmt.Appendf(nil, "g%03d%03d#", pi, ci)
				d := p.want(c)
				frames := c.frames(marker)
				before := s.counts(t)
				s.write(t, frames...)
				passes := d == datapath.DecisionAllow || d == datapath.DecisionHostOnly
				want := delivery{bridge: passes}
				if passes && c.sock != "" {
					want.socks = []string{c.sock}
				}
				wait := 20 * time.Millisecond
				if passes {
					wait = 300 * time.Millisecond
				}
				got := s.collectUntil(marker, wait, want)
				counted := s.counts(t).since(before)
				wantCounted := map[string]uint64{d.String(): uint64(len(frames))}
				if !maps.Equal(counted, wantCounted) || got.bridge != want.bridge || !slices.Equal(got.socks, want.socks) {
					t.Errorf("case %d %q (issue 21 case %d): counted %v, want %v; reached bridge %v, host sockets %v; want bridge %v, sockets %v",
						ci, c.name, c.issue, counted, wantCounted, got.bridge, got.socks, want.bridge, want.socks)
				}
			}
		})
	}
}
