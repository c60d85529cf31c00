package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
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

type portList []attachreg.HostPort

func (p *portList) String() string { return fmt.Sprint(*p) }
func (p *portList) Set(s string) error {
	hp, err := attachreg.ParseHostPort(s)
	if err != nil {
		return err
	}
	*p = append(*p, hp)
	return nil
}

// runTap adds or deletes a tenant tap the way CNI ADD and DEL do (the same
// lock, tap lifecycle and registry), for labs and the demo. The CNI plugin
// is the production path.
func runTap(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "add" && args[0] != "del" && args[0] != "hold") {
		return errors.New("usage: galactic-node tap add|del|hold --vpc V --attachment A [--owner ID] [flags]")
	}
	verb := args[0]
	fs := flag.NewFlagSet("galactic-node tap "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	vpc := fs.String("vpc", "", "VPC identifier, base62")
	att := fs.String("attachment", "", "attachment identifier, base62")
	owner := fs.String("owner", "", "owner stamp (container ID)")
	bpffs := fs.String("bpffs", "/sys/fs/bpf", "bpf filesystem")
	lockDir := fs.String("vrf-lock-dir", vrf.DefaultDir, "per-VRF lock folder")
	table := fs.Uint("table", 1000, "the VRF's routing table")
	master := fs.String("master", "vrf", "vrf, or bridge where the kernel has no VRF support")
	mtu := fs.Uint("mtu", 0, "MTU (0: kernel default)")
	var routes prefixList
	fs.Var(&routes, "route", "a route through the tap (repeatable)")
	gw4 := fs.String("gateway4", "", "the tenant gateway's IPv4 address")
	var ports portList
	fs.Var(&ports, "host-port", "a host-only port, tcp/N or udp/N (repeatable)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	id, err := identity.ParseBase62(*vpc, *att)
	if err != nil {
		return fmt.Errorf("--vpc/--attachment: %w", err)
	}
	if verb == "hold" {
		return holdTap(ctx, id, stdout)
	}
	if *owner == "" {
		return errors.New("--owner is required")
	}
	locks, err := vrf.NewLocker(*lockDir)
	if err != nil {
		return err
	}
	conn, err := link.Dial(nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	dp, err := datapath.Load(*bpffs)
	if err != nil {
		return err
	}
	defer dp.Close()
	reg := attachreg.New(dp, nil, nil)
	taps := tap.NewManager(nil, conn, nil)

	if verb == "del" {
		return tapDel(ctx, conn, reg, locks, id, *owner, stdout)
	}
	unlock, err := locks.Lock(ctx, id.VPC)
	if err != nil {
		return err
	}
	defer unlock()

	kind := tap.MasterVRF
	switch *master {
	case "vrf":
	case "bridge":
		kind = tap.MasterBridge
	default:
		return fmt.Errorf("--master %q: want vrf or bridge", *master)
	}
	var gw datapath.Gateway
	if *gw4 != "" {
		if gw.IPv4, err = netip.ParseAddr(*gw4); err != nil {
			return fmt.Errorf("--gateway4: %w", err)
		}
	}
	res, err := taps.Create(ctx, tap.Config{Identity: id, Owner: *owner, MTU: uint32(*mtu), Master: kind, Table: uint32(*table), Routes: routes})
	if err != nil {
		return err
	}
	err = reg.RegisterInterface(ctx, res.Tap.Index, attachreg.Registration{
		Identity: id, Table: uint32(*table), Egress: datapath.EgressTap,
		Policy:  datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow},
		Gateway: gw, HostOnlyPorts: ports,
	})
	if err != nil {
		if !res.Adopted {
			_ = taps.Delete(context.WithoutCancel(ctx), id, *owner)
		}
		return err
	}
	fmt.Fprintf(stdout, "%s ifindex %d owner %s adopted=%v\n", res.Tap.Name, res.Tap.Index, *owner, res.Adopted)
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
	out := rm.Remove(ctx, []teardown.Target{{Expect: link.Expect{Index: l.Index, Name: l.Name, Alias: l.Alias}, Identity: id}}, teardown.Options{RemoveHeld: true})
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
