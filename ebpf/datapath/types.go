package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Limits of a policy row, fixed by the C layout.
const (
	MaxEthertypes = 8
	MaxProtocols  = 8
)

// ErrInvalidRow is wrapped by errors for rows that cannot be written.
var ErrInvalidRow = errors.New("invalid row")

// VPC and Attachment are the tenant numbers the program counts by, as wide
// as the C layout holds them. The datapath gives them no meaning beyond
// that: node/attachreg translates them to and from the tenant identities
// (node/identity) that name taps, so this package depends on nothing of the
// node. VPC 0 is no tenant: the program never writes it, and no row may
// carry it.
type (
	VPC        uint64
	Attachment uint16
)

// MarshalText writes the VPC in base62, as tap names and cluster objects
// carry it, so that a row reads like the name of its tap.
func (v VPC) MarshalText() ([]byte, error) { return []byte(base62(uint64(v))), nil }

// MarshalText writes the attachment in base62, as VPC does.
func (a Attachment) MarshalText() ([]byte, error) { return []byte(base62(uint64(a))), nil }

// base62 writes n with the digits 0-9, a-z, A-Z, unpadded: the form of
// node/identity's Base62, which attachreg's tests hold this to.
func base62(n uint64) string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	var buf [11]byte // 62^11 > 2^64
	i := len(buf)
	for {
		i--
		buf[i] = digits[n%62]
		if n /= 62; n == 0 {
			return string(buf[i:])
		}
	}
}

// VRFBinding is the ifindex_vrf row: where an interface's traffic is routed
// and whose it is.
type VRFBinding struct {
	Table      uint32     `json:"table"`
	VPC        VPC        `json:"vpc"`
	Attachment Attachment `json:"attachment"`
}

func (b VRFBinding) raw() (datapathVrfBinding, error) {
	if b.VPC == 0 || b.Table == 0 {
		return datapathVrfBinding{}, fmt.Errorf("vrf binding %+v: need a VPC and a table: %w", b, ErrInvalidRow)
	}
	return datapathVrfBinding{Table: b.Table, Vpc: uint64(b.VPC), Attachment: uint16(b.Attachment)}, nil
}

func vrfBindingFrom(r datapathVrfBinding) VRFBinding {
	return VRFBinding{Table: r.Table, VPC: VPC(r.Vpc), Attachment: Attachment(r.Attachment)}
}

// Action is a policy's default action.
type Action uint8

const (
	ActionAllow Action = 0
	ActionDeny  Action = 1
)

var actionNames = []string{"allow", "deny"}

func (a Action) String() string { return word(actionNames, int(a)) }

// MarshalText writes the action as a word.
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText reads "allow" or "deny".
func (a *Action) UnmarshalText(b []byte) error { return unword(actionNames, string(b), (*uint8)(a)) }

// Policy is the traffic_policy row of an interface. Empty lists allow every
// ethertype or IP protocol. docs/datapath.md states how the program applies
// it.
type Policy struct {
	// Generation is the configuration's version, for whoever wrote it; the
	// program does not read it.
	Generation    uint64     `json:"generation"`
	DefaultAction Action     `json:"defaultAction"`
	Ethertypes    []uint16   `json:"ethertypes,omitempty"`
	Protocols     []Protocol `json:"protocols,omitempty"`
	// AllowSpoofing turns anti-spoofing off. It is on by default (the zero
	// value): frames from a group MAC or another MAC than the attachment's,
	// IP packets from an address that is not the attachment's, ARP and
	// neighbor advertisements claiming one, router advertisements,
	// redirects and DHCP server messages are dropped as spoofed
	// (docs/datapath.md).
	AllowSpoofing bool `json:"allowSpoofing,omitempty"`
}

// policySpoofingAllowed is traffic_policy.flags' bit for AllowSpoofing.
const policySpoofingAllowed = 0x1

func (p Policy) raw() (datapathTrafficPolicy, error) {
	if p.DefaultAction > ActionDeny || len(p.Ethertypes) > MaxEthertypes || len(p.Protocols) > MaxProtocols {
		return datapathTrafficPolicy{}, fmt.Errorf("policy: action %d, %d ethertypes (max %d), %d protocols (max %d): %w",
			p.DefaultAction, len(p.Ethertypes), MaxEthertypes, len(p.Protocols), MaxProtocols, ErrInvalidRow)
	}
	r := datapathTrafficPolicy{
		Generation:    p.Generation,
		DefaultAction: uint8(p.DefaultAction),
		N_ethertypes:  uint8(len(p.Ethertypes)),
		N_protocols:   uint8(len(p.Protocols)),
	}
	if p.AllowSpoofing {
		r.Flags |= policySpoofingAllowed
	}
	copy(r.Ethertypes[:], p.Ethertypes)
	for i, proto := range p.Protocols {
		r.Protocols[i] = uint8(proto)
	}
	return r, nil
}

func policyFrom(r datapathTrafficPolicy) Policy {
	p := Policy{Generation: r.Generation, DefaultAction: Action(r.DefaultAction), AllowSpoofing: r.Flags&policySpoofingAllowed != 0}
	if n := min(int(r.N_ethertypes), MaxEthertypes); n > 0 {
		p.Ethertypes = append([]uint16(nil), r.Ethertypes[:n]...)
	}
	if n := min(int(r.N_protocols), MaxProtocols); n > 0 {
		p.Protocols = make([]Protocol, n)
		for i := range n {
			p.Protocols[i] = Protocol(r.Protocols[i])
		}
	}
	return p
}

// MaxHostPorts is how many host-only ports one interface's rules hold.
const MaxHostPorts = 16

// Port is a port of the host's tenant gateway that an interface's tenant may
// reach.
type Port struct {
	Protocol Protocol `json:"protocol"`
	Port     uint16   `json:"port"`
}

// Rules is the tap_rules row of an interface: everything the program judges
// its frames by (policy, gateway, host-only ports) and whose frames they are,
// in one value that is written and read whole under the row's lock.
// Ifindex is the interface's own, which the program checks: a row that does
// not name its key judges nothing (the program drops the frame).
type Rules struct {
	Ifindex    uint32     `json:"ifindex"`
	VPC        VPC        `json:"vpc"`
	Attachment Attachment `json:"attachment"`
	Policy     Policy     `json:"policy"`
	Gateway    Gateway    `json:"gateway"`
	HostPorts  []Port     `json:"hostPorts,omitempty"`
	// MAC and Prefixes are the attachment's own: with anti-spoofing on,
	// frames from another source MAC (when MAC is set) and packets from an
	// address in none of the prefixes of their family are dropped as
	// spoofed. Up to MaxPrefixes per family.
	MAC      HardwareAddr   `json:"mac,omitempty"`
	Prefixes []netip.Prefix `json:"prefixes,omitempty"`
	// Unbound marks rules the node daemon derived from an older build's
	// rows without knowing the attachment's MAC and addresses (no record
	// of its ADD said them): anti-spoofing is off for it until an ADD
	// registers it. The program ignores the mark; operators see it.
	Unbound bool `json:"unbound,omitempty"`
}

// rulesUnbound is tap_rules.flags' bit for Unbound (RULES_UNBOUND).
const rulesUnbound = 0x2

// MaxPrefixes is how many address prefixes of each family an interface's
// rules hold.
const MaxPrefixes = 4

// HardwareAddr is a MAC address that marshals as text.
type HardwareAddr []byte

// MarshalText writes the address as net.HardwareAddr does.
func (a HardwareAddr) MarshalText() ([]byte, error) { return []byte(net.HardwareAddr(a).String()), nil }

func (r Rules) raw() (datapathTapRules, error) {
	var out datapathTapRules
	if r.Ifindex == 0 || r.VPC == 0 || len(r.HostPorts) > MaxHostPorts {
		return out, fmt.Errorf("rules of ifindex %d, vpc %d, %d host ports (max %d): %w",
			r.Ifindex, r.VPC, len(r.HostPorts), MaxHostPorts, ErrInvalidRow)
	}
	pol, err := r.Policy.raw()
	if err != nil {
		return out, err
	}
	gw, err := r.Gateway.raw()
	if err != nil {
		return out, err
	}
	raw := &out.Rules
	raw.Ifindex, raw.Vpc, raw.Attachment = r.Ifindex, uint64(r.VPC), uint16(r.Attachment)
	raw.Generation, raw.DefaultAction, raw.Flags = pol.Generation, pol.DefaultAction, pol.Flags
	if r.Unbound {
		raw.Flags |= rulesUnbound
	}
	raw.N_ethertypes, raw.Ethertypes = pol.N_ethertypes, pol.Ethertypes
	raw.N_protocols, raw.Protocols = pol.N_protocols, pol.Protocols
	raw.GatewayIpv4, raw.GatewayIpv6 = gw.Ipv4, gw.Ipv6
	if len(r.MAC) != 0 && len(r.MAC) != 6 {
		return out, fmt.Errorf("mac %v: want 6 bytes: %w", net.HardwareAddr(r.MAC), ErrInvalidRow)
	}
	copy(raw.Mac[:], r.MAC)
	for _, p := range r.Prefixes {
		if !p.IsValid() || p.Addr().Is4In6() {
			return out, fmt.Errorf("prefix %v: %w", p, ErrInvalidRow)
		}
		p = p.Masked()
		if p.Addr().Is4() {
			if int(raw.N_prefixes4) == MaxPrefixes {
				return out, fmt.Errorf("more than %d IPv4 prefixes: %w", MaxPrefixes, ErrInvalidRow)
			}
			raw.Prefixes4[raw.N_prefixes4].Addr, raw.Prefixes4[raw.N_prefixes4].Len = p.Addr().As4(), uint8(p.Bits())
			raw.N_prefixes4++
			continue
		}
		if int(raw.N_prefixes6) == MaxPrefixes {
			return out, fmt.Errorf("more than %d IPv6 prefixes: %w", MaxPrefixes, ErrInvalidRow)
		}
		raw.Prefixes6[raw.N_prefixes6].Addr, raw.Prefixes6[raw.N_prefixes6].Len = p.Addr().As16(), uint8(p.Bits())
		raw.N_prefixes6++
	}
	raw.N_ports = uint8(len(r.HostPorts))
	for i, p := range r.HostPorts {
		if (p.Protocol != ProtocolTCP && p.Protocol != ProtocolUDP) || p.Port == 0 {
			return out, fmt.Errorf("host port %v/%d: want tcp or udp and a port: %w", p.Protocol, p.Port, ErrInvalidRow)
		}
		raw.Ports[i].Port, raw.Ports[i].Protocol = p.Port, uint8(p.Protocol)
	}
	return out, nil
}

func rulesFrom(t datapathTapRules) Rules {
	raw := t.Rules
	r := Rules{Ifindex: raw.Ifindex, VPC: VPC(raw.Vpc), Attachment: Attachment(raw.Attachment),
		Policy: policyFrom(datapathTrafficPolicy{Generation: raw.Generation, DefaultAction: raw.DefaultAction, Flags: raw.Flags,
			N_ethertypes: raw.N_ethertypes, Ethertypes: raw.Ethertypes, N_protocols: raw.N_protocols, Protocols: raw.Protocols}),
		Gateway: gatewayFrom(datapathGateway{Ipv4: raw.GatewayIpv4, Ipv6: raw.GatewayIpv6}),
	}
	for _, p := range raw.Ports[:min(int(raw.N_ports), MaxHostPorts)] {
		r.HostPorts = append(r.HostPorts, Port{Protocol: Protocol(p.Protocol), Port: p.Port})
	}
	if raw.Mac != [6]uint8{} {
		r.MAC = HardwareAddr(raw.Mac[:])
	}
	r.Unbound = raw.Flags&rulesUnbound != 0
	for _, p := range raw.Prefixes4[:min(int(raw.N_prefixes4), MaxPrefixes)] {
		r.Prefixes = append(r.Prefixes, netip.PrefixFrom(netip.AddrFrom4(p.Addr), int(p.Len)))
	}
	for _, p := range raw.Prefixes6[:min(int(raw.N_prefixes6), MaxPrefixes)] {
		r.Prefixes = append(r.Prefixes, netip.PrefixFrom(netip.AddrFrom16(p.Addr), int(p.Len)))
	}
	return r
}

// EgressKind says what kind of interface a row belongs to.
type EgressKind uint32

const (
	EgressTap  EgressKind = 1
	EgressVeth EgressKind = 2
)

var egressNames = []string{"", "tap", "veth"}

func (k EgressKind) String() string { return word(egressNames, int(k)) }

// MarshalText writes the kind as a word.
func (k EgressKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

func (k EgressKind) raw() (uint32, error) {
	if k != EgressTap && k != EgressVeth {
		return 0, fmt.Errorf("egress kind %d: %w", uint32(k), ErrInvalidRow)
	}
	return uint32(k), nil
}

// Gateway is the tenant_gateway row: the addresses of the tenant's gateway
// on the host. An invalid (zero) address means none of that family.
type Gateway struct {
	IPv4 netip.Addr `json:"ipv4"`
	IPv6 netip.Addr `json:"ipv6"`
}

func (g Gateway) raw() (datapathGateway, error) {
	var r datapathGateway
	if g.IPv4.IsValid() {
		if !g.IPv4.Is4() {
			return r, fmt.Errorf("gateway ipv4 %v: %w", g.IPv4, ErrInvalidRow)
		}
		r.Ipv4 = g.IPv4.As4()
	}
	if g.IPv6.IsValid() {
		if !g.IPv6.Is6() || g.IPv6.Is4In6() {
			return r, fmt.Errorf("gateway ipv6 %v: %w", g.IPv6, ErrInvalidRow)
		}
		r.Ipv6 = g.IPv6.As16()
	}
	return r, nil
}

func gatewayFrom(r datapathGateway) Gateway {
	var g Gateway
	if r.Ipv4 != [4]uint8{} {
		g.IPv4 = netip.AddrFrom4(r.Ipv4)
	}
	if r.Ipv6 != [16]uint8{} {
		g.IPv6 = netip.AddrFrom16(r.Ipv6)
	}
	return g
}

// Protocol is an IP protocol number, written as a word where it has one.
type Protocol uint8

const (
	ProtocolTCP Protocol = 6
	ProtocolUDP Protocol = 17
)

func (p Protocol) String() string {
	switch p {
	case ProtocolTCP:
		return "tcp"
	case ProtocolUDP:
		return "udp"
	}
	return fmt.Sprintf("%d", uint8(p))
}

// MarshalText writes "tcp", "udp" or the number.
func (p Protocol) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// HostPort is a host_only_port key: a port of the host's tenant gateway
// that the interface's tenant may reach.
type HostPort struct {
	Ifindex  uint32   `json:"ifindex"`
	Protocol Protocol `json:"protocol"`
	Port     uint16   `json:"port"`
}

func (h HostPort) raw() (datapathHostPortKey, error) {
	if h.Ifindex == 0 || (h.Protocol != ProtocolTCP && h.Protocol != ProtocolUDP) || h.Port == 0 {
		return datapathHostPortKey{}, fmt.Errorf("host port %+v: need an ifindex, tcp or udp, and a port: %w", h, ErrInvalidRow)
	}
	return datapathHostPortKey{Ifindex: h.Ifindex, Port: h.Port, Protocol: uint8(h.Protocol)}, nil
}

func hostPortFrom(r datapathHostPortKey) HostPort {
	return HostPort{Ifindex: r.Ifindex, Protocol: Protocol(r.Protocol), Port: r.Port}
}

// Decision is what the program decided about a frame.
type Decision uint8

const (
	DecisionAllow    Decision = 0
	DecisionDeny     Decision = 1
	DecisionHostOnly Decision = 2
	// DecisionMalformed: dropped because the program could not read it
	// (an IP header the kernel would refuse or the frame cannot hold, an
	// IPv6 extension header chain it cannot finish walking, a first
	// fragment without its ports, a malformed ARP packet).
	DecisionMalformed Decision = 3
	// DecisionSpoofed: dropped by anti-spoofing: a source MAC or address
	// that is not the attachment's, or a message only a router or a DHCP
	// server sends.
	DecisionSpoofed Decision = 4
)

var decisionNames = []string{"allow", "deny", "host_only", "malformed", "spoofed"}

// Decisions are every decision the program makes, in their numeric order.
var Decisions = []Decision{DecisionAllow, DecisionDeny, DecisionHostOnly, DecisionMalformed, DecisionSpoofed}

func (d Decision) String() string { return word(decisionNames, int(d)) }

// MarshalText writes the decision as a word.
func (d Decision) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a decision's word, as MarshalText writes it.
func (d *Decision) UnmarshalText(b []byte) error {
	return unword(decisionNames, string(b), (*uint8)(d))
}

// DecisionKey is a key of the decisions counters: attributed decisions.
type DecisionKey struct {
	VPC        VPC        `json:"vpc"`
	Attachment Attachment `json:"attachment"`
	Decision   Decision   `json:"decision"`
}

func (k DecisionKey) raw() (datapathDecisionKey, error) {
	return datapathDecisionKey{Vpc: uint64(k.VPC), Attachment: uint16(k.Attachment), Decision: uint8(k.Decision)}, nil
}

func decisionKeyFrom(r datapathDecisionKey) DecisionKey {
	return DecisionKey{VPC: VPC(r.Vpc), Attachment: Attachment(r.Attachment), Decision: Decision(r.Decision)}
}

// Reason is why a decision could not be attributed to a tenant.
type Reason uint32

const (
	// ReasonPolicyUnavailable: no tap_rules row for the ingress ifindex
	// (or one being removed, or naming another interface).
	ReasonPolicyUnavailable Reason = 0
	// ReasonIdentityUnavailable: a policy but no ifindex_vrf row. Only
	// programs of older builds count it: this build's rules carry the
	// identity.
	ReasonIdentityUnavailable Reason = 1
	// ReasonDecisionsFull: the frame was judged (and passed or dropped)
	// but its identity has no decisions row and the map had no room for
	// one. Unlike the others, such a frame is not dropped for it.
	ReasonDecisionsFull Reason = 2
)

var reasonNames = []string{"policy_unavailable", "identity_unavailable", "decisions_full"}

func (r Reason) String() string { return word(reasonNames, int(r)) }

// MarshalText writes the reason as a word.
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func word(names []string, i int) string {
	if i >= 0 && i < len(names) && names[i] != "" {
		return names[i]
	}
	return fmt.Sprintf("unknown(%d)", i)
}

func unword(names []string, s string, out *uint8) error {
	for i, n := range names {
		if n != "" && n == s {
			*out = uint8(i)
			return nil
		}
	}
	return fmt.Errorf("%q is not one of %q: %w", s, names, ErrInvalidRow)
}

// Row is one key and value of a map, for views and dumps.
type Row[K, V any] struct {
	Key   K `json:"key"`
	Value V `json:"value"`
}
