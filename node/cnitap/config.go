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
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

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
	// GALACTIC_VPC_ATTACHMENT override them per invocation.
	VPC           string `json:"vpc,omitempty"`
	VPCAttachment string `json:"vpcAttachment,omitempty"`

	Table       uint32   `json:"table"`            // the VRF's routing table
	Master      string   `json:"master,omitempty"` // "vrf" (default), or "bridge" where the kernel has no VRF
	MTU         uint32   `json:"mtu,omitempty"`
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
	} `json:"policy,omitempty"`
	HostOnlyPorts []string `json:"hostOnlyPorts,omitempty"` // "udp/53", "tcp/22"

	BPFFS      string `json:"bpffs,omitempty"`      // default /sys/fs/bpf
	VRFLockDir string `json:"vrfLockDir,omitempty"` // default /run/galactic/vrf
}

// cniArgs are the per-invocation arguments read from CNI_ARGS.
type cniArgs struct {
	types.CommonArgs
	GALACTIC_VPC            types.UnmarshallableString //nolint:revive // CNI_ARGS keys are upper case
	GALACTIC_VPC_ATTACHMENT types.UnmarshallableString //nolint:revive
}

// invocation is a parsed, validated request: what to create or find.
type invocation struct {
	conf        NetConf
	containerID string
	identity    identity.Identity
	hasIdentity bool
	tap         tap.Config
	reg         attachreg.Registration
}

// errConfig marks input errors: CNI code 7, and nothing is changed.
var errConfig = errors.New("invalid network configuration")

func parse(args *skel.CmdArgs, needIdentity bool) (*invocation, error) {
	var conf NetConf
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		return nil, fmt.Errorf("%w: %w", errConfig, err)
	}
	if conf.BPFFS == "" {
		conf.BPFFS = "/sys/fs/bpf"
	}
	if conf.VRFLockDir == "" {
		conf.VRFLockDir = vrf.DefaultDir
	}
	inv := &invocation{conf: conf, containerID: args.ContainerID}
	if args.ContainerID == "" && needIdentity {
		return nil, fmt.Errorf("%w: CNI_CONTAINERID is empty", errConfig)
	}
	var ca cniArgs
	if args.Args != "" {
		if err := types.LoadArgs(args.Args, &ca); err != nil {
			return nil, fmt.Errorf("%w: CNI_ARGS: %w", errConfig, err)
		}
	}
	vpc, att := conf.VPC, conf.VPCAttachment
	if ca.GALACTIC_VPC != "" {
		vpc = string(ca.GALACTIC_VPC)
	}
	if ca.GALACTIC_VPC_ATTACHMENT != "" {
		att = string(ca.GALACTIC_VPC_ATTACHMENT)
	}
	if vpc != "" || att != "" {
		id, err := identity.ParseBase62(vpc, att)
		if err != nil {
			return nil, fmt.Errorf("%w: attachment identity: %w", errConfig, err)
		}
		inv.identity, inv.hasIdentity = id, true
	} else if needIdentity {
		return nil, fmt.Errorf("%w: no attachment identity: set vpc and vpcAttachment, or CNI_ARGS GALACTIC_VPC and GALACTIC_VPC_ATTACHMENT", errConfig)
	}
	if !inv.hasIdentity {
		return inv, nil
	}
	if err := inv.build(); err != nil {
		return nil, fmt.Errorf("%w: %w", errConfig, err)
	}
	return inv, nil
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
	var ports []attachreg.HostPort
	for _, p := range c.HostOnlyPorts {
		hp, err := attachreg.ParseHostPort(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ports = append(ports, hp)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	inv.tap = tap.Config{Identity: inv.identity, Owner: inv.containerID, SingleQueue: c.SingleQueue, UID: c.UID, GID: c.GID,
		MTU: c.MTU, Master: master, Table: c.Table, Routes: routes}
	inv.reg = attachreg.Registration{Identity: inv.identity, Table: c.Table, Egress: datapath.EgressTap,
		Policy:  datapath.Policy{Generation: c.Policy.Generation, DefaultAction: action, Ethertypes: c.Policy.Ethertypes, Protocols: protocols},
		Gateway: gw, HostOnlyPorts: ports}
	return nil
}
