// Package cnitap is the galactic-tap CNI plugin: ADD creates or adopts a
// tenant tap and registers its eBPF rows, DEL unregisters and deletes it,
// CHECK verifies both, GC removes taps of attachments the runtime no longer
// lists, STATUS says whether the plugin can work. Every change to a VPC's
// taps happens under that VPC's VRF lock, the same lock and the same
// attachreg the node daemon's reclaim uses, so the two clear exactly the
// same rows and never race.
package cnitap

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/tap"
	"github.com/datum-cloud/galactic-node/node/vrf"
)

// NetConf is the plugin's network configuration.
type NetConf struct {
	types.PluginConf

	// The attachment identity, base62. CNI_ARGS GALACTIC_VPC and
	// GALACTIC_VPC_ATTACHMENT override them per invocation, and the
	// network's own args.cni overrides both.
	VPC           string `json:"vpc,omitempty"`
	VPCAttachment string `json:"vpcAttachment,omitempty"`

	// Args is the network's per-invocation arguments as the CNI conventions
	// place them in its config: Multus puts a network selection's cni-args
	// here, one set per delegate, where CNI_ARGS is one set shared by every
	// delegate of the pod and cannot name two networks' identities.
	Args struct {
		CNI configArgs `json:"cni"`
	} `json:"args,omitempty"`

	Table  uint32 `json:"table"`            // the VRF's routing table
	Master string `json:"master,omitempty"` // "vrf" (default), or "bridge" where the kernel has no VRF
	MTU    uint32 `json:"mtu,omitempty"`
	// MultiQueue asks for a multiqueue tap, for a VMM that opens it with
	// queues=N. The default is a single-queue tap: the kernel gives every
	// multiqueue tun device 256 transmit queues, whatever the VMM uses,
	// and they pin about 2.7 times a veth pair's kernel memory
	// (docs/scale.md). SingleQueue, the old way to ask for the default,
	// is still read.
	MultiQueue  bool     `json:"multiQueue,omitempty"`
	SingleQueue bool     `json:"singleQueue,omitempty"`
	UID         *uint32  `json:"uid,omitempty"` // tun owner, for an unprivileged VMM
	GID         *uint32  `json:"gid,omitempty"`
	Routes      []string `json:"routes,omitempty"` // the attachment's routes, through the tap
	Gateway     struct {
		IPv4 string `json:"ipv4,omitempty"`
		IPv6 string `json:"ipv6,omitempty"`
	} `json:"gateway,omitempty"`
	Policy struct {
		DefaultAction string   `json:"defaultAction,omitempty"` // allow (default) or deny
		Ethertypes    []uint16 `json:"ethertypes,omitempty"`
		Protocols     []uint8  `json:"protocols,omitempty"`
		Generation    uint64   `json:"generation,omitempty"`
		// AllowSpoofing turns anti-spoofing off for the attachment; it is
		// on by default (docs/datapath.md).
		AllowSpoofing bool `json:"allowSpoofing,omitempty"`
	} `json:"policy,omitempty"`
	// MAC is the VM's MAC address, which anti-spoofing binds the
	// attachment's frames to; runtimeConfig.mac (the "mac" capability,
	// which Multus fills from a network selection's "mac") wins over it.
	// Unset in both, source MACs are not bound.
	MAC string `json:"mac,omitempty"`
	// RuntimeConfig holds what the runtime passes for the capabilities the
	// network declares: "mac", and "ips" (the attachment's addresses,
	// which anti-spoofing binds its packets' sources to, with the routes).
	RuntimeConfig struct {
		MAC string   `json:"mac,omitempty"`
		IPs []string `json:"ips,omitempty"`
	} `json:"runtimeConfig,omitempty"`
	HostOnlyPorts []string `json:"hostOnlyPorts,omitempty"` // "udp/53", "tcp/22"

	BPFFS      string `json:"bpffs,omitempty"`      // default /sys/fs/bpf
	VRFLockDir string `json:"vrfLockDir,omitempty"` // default /run/galactic/vrf
	DataDir    string `json:"dataDir,omitempty"`    // default /var/lib/cni/galactic-tap
}

// cniArgs are the per-invocation arguments read from CNI_ARGS.
type cniArgs struct {
	types.CommonArgs
	GALACTIC_VPC            types.UnmarshallableString //nolint:revive // CNI_ARGS keys are upper case
	GALACTIC_VPC_ATTACHMENT types.UnmarshallableString //nolint:revive
	GALACTIC_TABLE          types.UnmarshallableString //nolint:revive // the VRF's table, per VPC
}

// configArgs are the keys of args.cni this plugin reads: the same names as
// in CNI_ARGS. A table may be given as a number or a string.
type configArgs struct {
	VPC           string      `json:"GALACTIC_VPC,omitempty"`
	VPCAttachment string      `json:"GALACTIC_VPC_ATTACHMENT,omitempty"`
	Table         json.Number `json:"GALACTIC_TABLE,omitempty"`
}

func (a *configArgs) UnmarshalJSON(b []byte) error {
	var raw struct {
		VPC           string          `json:"GALACTIC_VPC"`
		VPCAttachment string          `json:"GALACTIC_VPC_ATTACHMENT"`
		Table         json.RawMessage `json:"GALACTIC_TABLE"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("args.cni: %w", err)
	}
	a.VPC, a.VPCAttachment = raw.VPC, raw.VPCAttachment
	if len(raw.Table) > 0 {
		var s string
		if json.Unmarshal(raw.Table, &s) != nil {
			s = string(raw.Table)
		}
		a.Table = json.Number(s)
	}
	return nil
}

// invocation is a parsed, validated request: what to create or find.
type invocation struct {
	conf        NetConf
	containerID string
	ifName      string
	netns       string
	identity    identity.Identity
	hasIdentity bool
	identityErr error // DEL only: the identity given did not parse
	tap         tap.Config
	reg         attachreg.Registration
	// gcListed: the GC request carries cni.dev/valid-attachments at all
	// (an empty list is a list; a missing key is not).
	gcListed bool
}

// command says how much of a configuration a command reads.
type command int

const (
	cmdAdd    command = iota // identity and every field, validated
	cmdCheck                 // as ADD
	cmdDel                   // the identity and where things are; other fields are not read
	cmdGC                    // where things are, and the valid attachments
	cmdStatus                // where things are
)

// errConfig marks input errors: CNI code 7, and nothing is changed.
var errConfig = errors.New("invalid network configuration")

func parse(args *skel.CmdArgs, cmd command) (*invocation, error) {
	needIdentity := cmd == cmdAdd || cmd == cmdCheck
	var conf NetConf
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		if cmd != cmdDel {
			return nil, fmt.Errorf("%w: %w", errConfig, err)
		}
		// DEL must get through whatever else is wrong with the
		// configuration, or the runtime retries it forever: read only
		// what DEL uses.
		var lenient struct {
			types.PluginConf
			VPC           string          `json:"vpc"`
			VPCAttachment string          `json:"vpcAttachment"`
			Args          json.RawMessage `json:"args"`
			BPFFS         string          `json:"bpffs"`
			VRFLockDir    string          `json:"vrfLockDir"`
			DataDir       string          `json:"dataDir"`
		}
		if err := json.Unmarshal(args.StdinData, &lenient); err != nil {
			return nil, fmt.Errorf("%w: %w", errConfig, err)
		}
		conf = NetConf{PluginConf: lenient.PluginConf, VPC: lenient.VPC, VPCAttachment: lenient.VPCAttachment,
			BPFFS: lenient.BPFFS, VRFLockDir: lenient.VRFLockDir, DataDir: lenient.DataDir}
		// Malformed args are no reason to fail a DEL either.
		_ = json.Unmarshal(lenient.Args, &conf.Args)
	}
	if conf.BPFFS == "" {
		conf.BPFFS = "/sys/fs/bpf"
	}
	if conf.VRFLockDir == "" {
		conf.VRFLockDir = vrf.DefaultDir
	}
	if conf.DataDir == "" {
		conf.DataDir = DefaultDataDir
	}
	inv := &invocation{conf: conf, containerID: args.ContainerID, ifName: args.IfName, netns: args.Netns}
	if cmd == cmdGC {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(args.StdinData, &keys); err == nil {
			_, inv.gcListed = keys["cni.dev/valid-attachments"]
		}
	}
	if args.ContainerID == "" && needIdentity {
		return nil, fmt.Errorf("%w: CNI_CONTAINERID is empty", errConfig)
	}
	var ca cniArgs
	if args.Args != "" {
		if err := types.LoadArgs(args.Args, &ca); err != nil {
			return nil, fmt.Errorf("%w: CNI_ARGS: %w", errConfig, err)
		}
	}
	// The network's own args.cni wins over CNI_ARGS, which wins over the
	// plain fields: the most specific source names this network's tap.
	ac := conf.Args.CNI
	for _, t := range []struct{ from, v string }{{"CNI_ARGS", string(ca.GALACTIC_TABLE)}, {"args.cni", string(ac.Table)}} {
		if t.v == "" {
			continue
		}
		n, err := strconv.ParseUint(t.v, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: %s GALACTIC_TABLE %q: %w", errConfig, t.from, t.v, err)
		}
		inv.conf.Table = uint32(n)
	}
	vpc, att := conf.VPC, conf.VPCAttachment
	for _, v := range []struct{ vpc, att string }{{string(ca.GALACTIC_VPC), string(ca.GALACTIC_VPC_ATTACHMENT)}, {ac.VPC, ac.VPCAttachment}} {
		if v.vpc != "" {
			vpc = v.vpc
		}
		if v.att != "" {
			att = v.att
		}
	}
	if vpc != "" || att != "" {
		id, err := identity.ParseBase62(vpc, att)
		switch {
		case err == nil:
			inv.identity, inv.hasIdentity = id, true
		case cmd == cmdDel:
			// No ADD could have made a tap of it: DEL goes on as one
			// the runtime gave no identity, by this attachment's records.
			inv.identityErr = err
		default:
			return nil, fmt.Errorf("%w: attachment identity: %w", errConfig, err)
		}
	} else if needIdentity {
		return nil, fmt.Errorf("%w: no attachment identity: set vpc and vpcAttachment, or CNI_ARGS GALACTIC_VPC and GALACTIC_VPC_ATTACHMENT", errConfig)
	}
	if !inv.hasIdentity || !needIdentity {
		return inv, nil
	}
	if err := inv.build(); err != nil {
		return nil, fmt.Errorf("%w: %w", errConfig, err)
	}
	return inv, nil
}

// errNoAddress refuses a registration that would black-hole its VM:
// anti-spoofing drops every IP packet from an address outside the
// attachment's, and it has none. KubeVirt names a definition and fills
// only "mac"; such a VM would start, reach a DHCP server, and then be cut
// off with no signal but counters (issue 49). No real attachment needs to
// speak IP with no address of its own: one that carries no IP at all lists
// its ethertypes without IPv4 and IPv6, and is not refused.
var errNoAddress = errors.New(`anti-spoofing is on and the attachment has no address, so every IP packet its VM sent would be dropped as spoofed: ` +
	`give it its addresses with "routes" in the definition's galactic-tap entry, or "ips" in the pod's network selection ` +
	`(the definition declares the "ips" capability), or turn anti-spoofing off for this definition with "policy": {"allowSpoofing": true}`)

// admitsIP reports whether a policy's ethertype list lets IPv4 or IPv6
// through (an empty list lets everything through).
func admitsIP(ethertypes []uint16) bool {
	return len(ethertypes) == 0 || slices.Contains(ethertypes, 0x0800) || slices.Contains(ethertypes, 0x86dd)
}

// build turns the configuration into the tap and registration it asks for,
// refusing anything malformed before a single change is made.
func (inv *invocation) build() error {
	c := inv.conf
	var errs []error
	master := tap.MasterVRF
	switch c.Master {
	case "", "vrf":
	case "bridge":
		master = tap.MasterBridge
	default:
		errs = append(errs, fmt.Errorf("master %q: want vrf or bridge", c.Master))
	}
	if c.Table == 0 || c.Table == unix.RT_TABLE_MAIN || c.Table == unix.RT_TABLE_LOCAL {
		errs = append(errs, fmt.Errorf("table %d is not a VRF table", c.Table))
	}
	if c.MultiQueue && c.SingleQueue {
		errs = append(errs, errors.New("multiQueue and singleQueue both set: ask for one"))
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		errs = append(errs, fmt.Errorf("mtu %d outside 68..65535", c.MTU))
	}
	if len(c.Policy.Ethertypes) > datapath.MaxEthertypes || len(c.Policy.Protocols) > datapath.MaxProtocols {
		errs = append(errs, fmt.Errorf("policy lists %d ethertypes and %d protocols: at most %d and %d", len(c.Policy.Ethertypes), len(c.Policy.Protocols), datapath.MaxEthertypes, datapath.MaxProtocols))
	}
	if _, err := networkDir(c.DataDir, c.Name); err != nil {
		errs = append(errs, err)
	}
	var routes []netip.Prefix
	for _, r := range c.Routes {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %q: %w", r, err))
			continue
		}
		routes = append(routes, p)
	}
	var gw datapath.Gateway
	for _, g := range []struct {
		s    string
		dst  *netip.Addr
		want func(netip.Addr) bool
		name string
	}{{c.Gateway.IPv4, &gw.IPv4, netip.Addr.Is4, "ipv4"}, {c.Gateway.IPv6, &gw.IPv6, netip.Addr.Is6, "ipv6"}} {
		if g.s == "" {
			continue
		}
		a, err := netip.ParseAddr(g.s)
		if err != nil || !g.want(a) {
			errs = append(errs, fmt.Errorf("gateway %s %q is not an %s address", g.name, g.s, g.name))
			continue
		}
		*g.dst = a
	}
	action := datapath.ActionAllow
	switch c.Policy.DefaultAction {
	case "", "allow":
	case "deny":
		action = datapath.ActionDeny
	default:
		errs = append(errs, fmt.Errorf("policy defaultAction %q: want allow or deny", c.Policy.DefaultAction))
	}
	protocols := make([]datapath.Protocol, len(c.Policy.Protocols))
	for i, p := range c.Policy.Protocols {
		protocols[i] = datapath.Protocol(p)
	}
	// The attachment's addresses: its routes, and the "ips" capability's
	// addresses, each alone (the capability writes an address with its
	// subnet's length; the subnet is not the attachment's).
	addresses := slices.Clone(routes)
	for _, ip := range c.RuntimeConfig.IPs {
		p, err := netip.ParsePrefix(ip)
		if err != nil {
			a, aerr := netip.ParseAddr(ip)
			if aerr != nil {
				errs = append(errs, fmt.Errorf("runtimeConfig.ips %q: want an address or address/length", ip))
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		addresses = append(addresses, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
	}
	var mac net.HardwareAddr
	for _, m := range []struct{ name, s string }{{"mac", c.MAC}, {"runtimeConfig.mac", c.RuntimeConfig.MAC}} {
		if m.s == "" {
			continue
		}
		hw, err := net.ParseMAC(m.s)
		if err != nil || len(hw) != 6 || hw[0]&1 != 0 {
			errs = append(errs, fmt.Errorf("%s %q: want a unicast Ethernet address", m.name, m.s))
			continue
		}
		mac = hw
	}
	if !c.Policy.AllowSpoofing && len(addresses) == 0 && admitsIP(c.Policy.Ethertypes) {
		errs = append(errs, errNoAddress)
	}
	var ports []attachreg.ProtoPort
	for _, p := range c.HostOnlyPorts {
		hp, err := attachreg.ParseProtoPort(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ports = append(ports, hp)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	inv.tap = tap.Config{Identity: inv.identity, Owner: inv.containerID, SingleQueue: !c.MultiQueue, UID: c.UID, GID: c.GID,
		MTU: c.MTU, Master: master, Table: c.Table, Routes: routes}
	inv.reg = attachreg.Registration{Identity: inv.identity, Table: c.Table, Egress: datapath.EgressTap,
		Policy: datapath.Policy{Generation: c.Policy.Generation, DefaultAction: action, Ethertypes: c.Policy.Ethertypes,
			Protocols: protocols, AllowSpoofing: c.Policy.AllowSpoofing},
		Gateway: gw, HostOnlyPorts: ports, MAC: mac, Addresses: addresses}
	if err := inv.reg.Validate(); err != nil {
		return err
	}
	return nil
}
