package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/internal/cli"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tap"
	"github.com/datum-cloud/galactic-node/node/teardown"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/vrf"
)

type prefixList []netip.Prefix

func (p *prefixList) String() string { return fmt.Sprint(*p) }
func (p *prefixList) Set(s string) error {
	v, err := netip.ParsePrefix(s)
	if err != nil {
		return err
	}
	*p = append(*p, v)
	return nil
}

type portList []attachreg.ProtoPort

func (p *portList) String() string { return fmt.Sprint(*p) }
func (p *portList) Set(s string) error {
	hp, err := attachreg.ParseProtoPort(s)
	if err != nil {
		return err
	}
	*p = append(*p, hp)
	return nil
}

// tapFlags are the flags of galactic-node tap add|del|hold.
type tapFlags struct {
	vpc, att, owner, bpffs, lockDir, master, gw4, mac string
	table, mtu                                        uint
	routes                                            prefixList
	ports                                             portList
}

// tapFlagSet defines the flags of galactic-node tap verb into t.
func tapFlagSet(verb string, t *tapFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("galactic-node tap "+verb, flag.ContinueOnError)
	fs.StringVar(&t.vpc, "vpc", "", "VPC identifier, base62")
	fs.StringVar(&t.att, "attachment", "", "attachment identifier, base62")
	fs.StringVar(&t.owner, "owner", "", "owner stamp (container ID)")
	fs.StringVar(&t.bpffs, "bpffs", "/sys/fs/bpf", "bpf filesystem")
	fs.StringVar(&t.lockDir, "vrf-lock-dir", vrf.DefaultDir, "per-VRF lock folder")
	fs.UintVar(&t.table, "table", 1000, "the VRF's routing table")
	fs.StringVar(&t.master, "master", "vrf", "vrf, or bridge where the kernel has no VRF support")
	fs.UintVar(&t.mtu, "mtu", 0, "MTU (0: kernel default)")
	fs.Var(&t.routes, "route", "a route through the tap (repeatable; from the environment, one)")
	fs.StringVar(&t.gw4, "gateway4", "", "the tenant gateway's IPv4 address")
	fs.StringVar(&t.mac, "mac", "", "the VM's MAC address, which anti-spoofing binds its frames to (its routes bind its addresses)")
	fs.Var(&t.ports, "host-port", "a host-only port, tcp/N or udp/N (repeatable; from the environment, one)")
	return fs
}

const tapSynopsis = "galactic-node tap add|del|hold --vpc V --attachment A [--owner ID] [flags]"

// runTap adds or deletes a tenant tap the way CNI ADD and DEL do (the same
// lock, tap lifecycle and registry), for labs and the demo. The CNI plugin
// is the production path.
func runTap(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help") {
		cli.PrintUsage(stdout, tapFlagSet("add", &tapFlags{}), tapSynopsis)
		return flag.ErrHelp
	}
	if len(args) == 0 {
		return cli.Misuse("galactic-node tap", errors.New("tap needs add, del or hold"))
	}
	if args[0] != "add" && args[0] != "del" && args[0] != "hold" {
		return cli.Misuse("galactic-node tap", fmt.Errorf("tap %q: want add, del or hold", args[0]))
	}
	verb := args[0]
	var t tapFlags
	fs := tapFlagSet(verb, &t)
	if err := cli.Parse(fs, tapSynopsis, args[1:], environ, knownEnv(), stdout); err != nil {
		return err
	}
	id, err := identity.ParseBase62(t.vpc, t.att)
	if err != nil {
		return cli.Misuse(fs.Name(), fmt.Errorf("--vpc/--attachment: %w", err))
	}
	if verb == "hold" {
		return holdTap(ctx, id, stdout)
	}
	if t.owner == "" {
		return cli.Misuse(fs.Name(), errors.New("--owner is required"))
	}
	locks, err := vrf.NewLocker(t.lockDir)
	if err != nil {
		return err
	}
	conn, err := link.Dial(nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	dp, err := datapath.Load(t.bpffs)
	if err != nil {
		return err
	}
	defer dp.Close()
	// The tap runs the program pinned for this build, as CNI ADD's do.
	if err := dp.AdoptProgram(); err != nil {
		return err
	}
	reg := attachreg.New(dp, nil, nil)
	taps := tap.NewManager(nil, conn, nil)

	if verb == "del" {
		return tapDel(ctx, conn, reg, locks, id, t.owner, stdout)
	}
	unlock, err := locks.Lock(ctx, id.VPC)
	if err != nil {
		return err
	}
	defer unlock()

	kind := tap.MasterVRF
	switch t.master {
	case "vrf":
	case "bridge":
		kind = tap.MasterBridge
	default:
		return cli.Misuse(fs.Name(), fmt.Errorf("--master %q: want vrf or bridge", t.master))
	}
	var mac net.HardwareAddr
	if t.mac != "" {
		if mac, err = net.ParseMAC(t.mac); err != nil {
			return cli.Misuse(fs.Name(), fmt.Errorf("--mac: %w", err))
		}
	}
	var gw datapath.Gateway
	if t.gw4 != "" {
		if gw.IPv4, err = netip.ParseAddr(t.gw4); err != nil {
			return cli.Misuse(fs.Name(), fmt.Errorf("--gateway4: %w", err))
		}
	}
	res, err := taps.Create(ctx, tap.Config{Identity: id, Owner: t.owner, MTU: uint32(t.mtu), Master: kind, Table: uint32(t.table), Routes: t.routes})
	if err != nil {
		return err
	}
	err = reg.RegisterInterface(ctx, res.Tap.Index, attachreg.Registration{
		Identity: id, Table: uint32(t.table), Egress: datapath.EgressTap,
		Policy:  datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow},
		Gateway: gw, HostOnlyPorts: t.ports, MAC: mac, Addresses: t.routes,
	})
	if err != nil {
		if !res.Adopted {
			_ = taps.Delete(context.WithoutCancel(ctx), id, t.owner)
		}
		return err
	}
	fmt.Fprintf(stdout, "%s ifindex %d owner %s adopted=%v\n", res.Tap.Name, res.Tap.Index, t.owner, res.Adopted)
	return nil
}

// tapDel removes the tap of id as CNI DEL does, through the one teardown:
// only if owner stamped it, link first, then its rows.
func tapDel(ctx context.Context, conn *link.Conn, reg *attachreg.Registry, locks *vrf.Locker, id identity.Identity, owner string, stdout io.Writer) error {
	l, err := conn.GetByName(ctx, id.TapName())
	if errors.Is(err, link.ErrLinkGone) {
		fmt.Fprintf(stdout, "%s already gone\n", id.TapName())
		return nil
	}
	if err != nil {
		return err
	}
	if l.Alias != owner {
		return fmt.Errorf("%s is stamped %q, not %q: %w", l.Name, l.Alias, owner, tap.ErrOwnedByAnother)
	}
	rm := &teardown.Remover{Links: conn, Registry: reg, Locks: locks}
	out := rm.Remove(ctx, []teardown.TapRef{{Name: l.Name, Ifindex: l.Index, Owner: l.Alias, Identity: id}}, teardown.Options{RemoveHeld: true})
	for _, f := range out.Failed {
		return fmt.Errorf("delete tap %s: %s: %s", f.Tap.Name, f.Stage, f.Error)
	}
	for _, k := range out.Kept {
		return fmt.Errorf("delete tap %s: kept: %s", k.Tap.Name, k.Why)
	}
	fmt.Fprintf(stdout, "%s deleted\n", id.TapName())
	return nil
}

// holdTap attaches a queue to the tap and keeps it open until a signal, as
// a VMM would: the stand-in a lab uses for a tap in use.
func holdTap(ctx context.Context, id identity.Identity, stdout io.Writer) error {
	f, err := tun.Open(nil, id.TapName(), tun.Mode{})
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(stdout, "holding %s until interrupted\n", id.TapName())
	<-ctx.Done()
	return nil
}
