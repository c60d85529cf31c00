package tap_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tap"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

const table = 1062

var (
	id     = identity.Identity{VPC: 62, Attachment: 65}
	routes = []netip.Prefix{netip.MustParsePrefix("10.62.65.0/24"), netip.MustParsePrefix("fd00:62:65::/64")}
)

// config uses a bridge where production uses a VRF: this kernel has no VRF
// support (docs/kernel.md).
func config(owner string) tap.Config {
	return tap.Config{Identity: id, Owner: owner, MTU: 1450, Master: tap.MasterBridge, Table: table, Routes: routes}
}

func setup(t *testing.T) (*nettest.NS, *link.Conn, *tap.Manager) {
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	return ns, c, tap.NewManager(ns.File, c, nil)
}

func routesOf(t *testing.T, ns *nettest.NS, name string) []string {
	t.Helper()
	var found []string
	for _, family := range []string{"-4", "-6"} {
		for _, line := range strings.Split(ns.IP(t, family, "route", "show", "table", "all"), "\n") {
			if strings.Contains(line, "dev "+name+" ") || strings.HasSuffix(line, "dev "+name) {
				found = append(found, line)
			}
		}
	}
	return found
}

func TestCreateMakesAStampedEnslavedTapWithLinkdownRoutes(t *testing.T) {
	ns, c, m := setup(t)
	res, err := m.Create(context.Background(), config("sandbox-1"))
	if err != nil {
		t.Fatal(err)
	}
	tp := res.Tap
	if res.Adopted || tp.Identity != id || tp.Alias != "sandbox-1" || !tp.AdminUp || tp.MTU != 1450 {
		t.Fatalf("result %+v", res)
	}
	if !tp.Tun.MultiQueue || !tp.Tun.Persist || heldNow(tp) {
		t.Fatalf("tun %+v held=%v; want persistent multiqueue, not held", tp.Tun, heldNow(tp))
	}
	master, err := c.Get(context.Background(), tp.Master)
	if err != nil || master.Name != id.VRFName() || master.Kind != "bridge" || !master.AdminUp {
		t.Fatalf("master %+v, %v", master, err)
	}
	got := routesOf(t, ns, id.TapName())
	if len(got) != 2 {
		t.Fatalf("routes through the tap: %q, want an IPv4 and an IPv6 route", got)
	}
	for _, r := range got {
		if !strings.Contains(r, "table 1062") || !strings.Contains(r, "linkdown") {
			t.Errorf("route %q: want it in table 1062 and linkdown until held", r)
		}
	}
}

func TestRoutesVanishWithTheTap(t *testing.T) {
	ns, _, m := setup(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, config("sandbox-1")); err != nil {
		t.Fatal(err)
	}
	if n := len(routesOf(t, ns, id.TapName())); n != 2 {
		t.Fatalf("%d routes before delete, want 2", n)
	}
	if err := m.Delete(ctx, id, "sandbox-1"); err != nil {
		t.Fatal(err)
	}
	for _, family := range []string{"-4", "-6"} {
		out := ns.IP(t, family, "route", "show", "table", "all")
		for _, r := range routes {
			if strings.Contains(out, r.String()) {
				t.Errorf("route %v survived its tap:\n%s", r, out)
			}
		}
	}
	if err := m.Delete(ctx, id, "sandbox-1"); err != nil {
		t.Fatalf("second Delete = %v, want nil (gone is done)", err)
	}
}

func TestAnExistingHeldTapIsAdoptedNotRecreated(t *testing.T) {
	ns, c, m := setup(t)
	ctx := context.Background()
	nettest.NewTap(t, ns, id.TapName(), tun.Mode{})
	nettest.Hold(t, ns, id.TapName(), nettest.HoldOptions{})
	before, _ := c.GetByName(ctx, id.TapName())

	res, err := m.Create(ctx, config("sandbox-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Adopted || res.Tap.Index != before.Index || !heldNow(res.Tap) || res.Tap.Alias != "sandbox-1" {
		t.Fatalf("result %+v held=%v; want the same held tap adopted and stamped", res, heldNow(res.Tap))
	}
	again, err := m.Create(ctx, config("sandbox-1"))
	if err != nil || !again.Adopted || again.Tap.Index != before.Index {
		t.Fatalf("repeated Create = %+v, %v; want the same tap adopted", again, err)
	}
}

func TestATapStampedByAnotherOwnerIsRefusedAndUnchanged(t *testing.T) {
	ns, c, m := setup(t)
	ctx := context.Background()
	nettest.NewTap(t, ns, id.TapName(), tun.Mode{})
	ns.IP(t, "link", "set", id.TapName(), "alias", "sandbox-other")

	if _, err := m.Create(ctx, config("sandbox-1")); !errors.Is(err, tap.ErrOwnedByAnother) {
		t.Fatalf("Create over another owner's tap = %v, want ErrOwnedByAnother", err)
	}
	l, err := c.GetByName(ctx, id.TapName())
	if err != nil || l.Alias != "sandbox-other" || l.Master != 0 || l.AdminUp {
		t.Fatalf("tap after refused Create: %+v, %v; want it untouched", l, err)
	}
	if err := m.Delete(ctx, id, "sandbox-1"); !errors.Is(err, tap.ErrOwnedByAnother) {
		t.Fatalf("Delete by another owner = %v, want ErrOwnedByAnother", err)
	}
	if _, err := c.GetByName(ctx, id.TapName()); err != nil {
		t.Fatalf("tap gone after a refused Delete: %v", err)
	}
}

func TestALinkOfTheTapNameThatIsNotATapIsRefused(t *testing.T) {
	ns, _, m := setup(t)
	ns.IP(t, "link", "add", id.TapName(), "type", "bridge")
	if _, err := m.Create(context.Background(), config("sandbox-1")); !errors.Is(err, tap.ErrNotATap) {
		t.Fatalf("Create = %v, want ErrNotATap", err)
	}
	if err := m.Delete(context.Background(), id, ""); !errors.Is(err, tap.ErrNotATap) {
		t.Fatalf("Delete = %v, want ErrNotATap", err)
	}
}

// TestAFailedCreateUndoesOnlyWhatItMade makes the IPv6 route fail (IPv6
// disabled on new links of the namespace): a tap the call created is deleted
// again, a tap it adopted is kept.
func TestAFailedCreateUndoesOnlyWhatItMade(t *testing.T) {
	ns, c, m := setup(t)
	ctx := context.Background()
	nettest.Run(t, "ip", "netns", "exec", ns.Name, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")

	if _, err := m.Create(ctx, config("sandbox-1")); err == nil {
		t.Fatal("Create with an IPv6 route on an IPv6-disabled tap succeeded")
	}
	if _, err := c.GetByName(ctx, id.TapName()); !errors.Is(err, link.ErrLinkGone) {
		t.Fatalf("tap after a failed Create that made it: %v, want it gone", err)
	}

	nettest.NewTap(t, ns, id.TapName(), tun.Mode{})
	if _, err := m.Create(ctx, config("sandbox-1")); err == nil {
		t.Fatal("Create with an IPv6 route on an IPv6-disabled tap succeeded")
	}
	if _, err := c.GetByName(ctx, id.TapName()); err != nil {
		t.Fatalf("adopted tap after a failed Create: %v, want it kept", err)
	}
}

func TestARealVRFIsAskedForAndItsAbsenceIsAClearError(t *testing.T) {
	_, c, m := setup(t)
	cfg := config("sandbox-1")
	cfg.Master = tap.MasterVRF
	res, err := m.Create(context.Background(), cfg)
	if err == nil {
		// A kernel with VRF support: the real device must have been made.
		master, err := c.Get(context.Background(), res.Tap.Master)
		if err != nil || master.Kind != "vrf" || master.Name != id.VRFName() {
			t.Fatalf("master %+v, %v; want VRF %s", master, err, id.VRFName())
		}
		return
	}
	if !strings.Contains(err.Error(), "ensure vrf "+id.VRFName()) {
		t.Fatalf("Create with a VRF master on a kernel without VRF = %v; want an error naming the VRF", err)
	}
	if _, err := c.GetByName(context.Background(), id.TapName()); !errors.Is(err, link.ErrLinkGone) {
		t.Fatalf("tap after a failed VRF: %v, want none made", err)
	}
}

func TestBadConfigChangesNothing(t *testing.T) {
	_, c, m := setup(t)
	ctx := context.Background()
	for name, mutate := range map[string]func(*tap.Config){
		"no owner":      func(c *tap.Config) { c.Owner = "" },
		"vpc 0":         func(c *tap.Config) { c.Identity.VPC = 0 },
		"mtu too small": func(c *tap.Config) { c.MTU = 10 },
		"main table":    func(c *tap.Config) { c.Table = 254 },
		"bad route":     func(c *tap.Config) { c.Routes = []netip.Prefix{{}} },
	} {
		cfg := config("sandbox-1")
		mutate(&cfg)
		if _, err := m.Create(ctx, cfg); err == nil {
			t.Errorf("%s: Create succeeded", name)
		}
	}
	links, err := c.Links(ctx)
	if err != nil || len(links) != 1 {
		t.Fatalf("links after refused Creates: %d (%v), want only lo", len(links), err)
	}
}

// heldNow is whether the kernel's attributes call tp held.
func heldNow(tp link.Tap) bool {
	held, _ := holder.Held(tp)
	return held
}
