package link_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

func readTap(t *testing.T, c *link.Conn, name string) link.Tap {
	t.Helper()
	links, err := c.Links(context.Background())
	if err != nil {
		t.Fatalf("Links: %v", err)
	}
	for _, tap := range link.TenantTaps(links) {
		if tap.Name == name {
			return tap
		}
	}
	t.Fatalf("tap %s not among %d links", name, len(links))
	return link.Tap{}
}

func TestTapViewDecodesStampMasterAndTun(t *testing.T) {
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	id := identity.Identity{VPC: 12345, Attachment: 7}
	nettest.NewTap(t, ns, id.TapName(), tun.Mode{})
	nettest.NewTap(t, ns, "G00000000100X", tun.Mode{}) // not a tenant name
	ns.IP(t, "link", "add", id.VRFName(), "type", "bridge")
	ns.IP(t, "link", "set", id.TapName(), "master", id.VRFName(), "alias", "sandbox-1", "up")

	tap := readTap(t, c, id.TapName())
	if tap.Identity != id || tap.Alias != "sandbox-1" || !tap.Stamped() || !tap.AdminUp {
		t.Fatalf("tap = %+v", tap)
	}
	if tap.MasterKind != "bridge" || tap.SlaveKind != "bridge" || tap.Master == 0 {
		t.Fatalf("master = %d kind %q slave kind %q; want the bridge standing in for the VRF", tap.Master, tap.MasterKind, tap.SlaveKind)
	}
	if !tap.Tun.Persist || !tap.Tun.MultiQueue || tap.Tun.Type.String() != "tap" {
		t.Fatalf("tun = %+v", tap.Tun)
	}
	links, _ := c.Links(context.Background())
	if taps := link.TenantTaps(links); len(taps) != 1 {
		t.Fatalf("TenantTaps = %d taps, want only the tenant-named one", len(taps))
	}
}

func TestDeleteRefusesALinkWhoseStampChanged(t *testing.T) {
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	ctx := context.Background()
	name := identity.Identity{VPC: 1, Attachment: 1}.TapName()
	nettest.NewTap(t, ns, name, tun.Mode{})
	ns.IP(t, "link", "set", name, "alias", "sandbox-a")
	tap := readTap(t, c, name)

	ns.IP(t, "link", "set", name, "alias", "sandbox-b")
	err := c.DeleteVerified(ctx, link.Expect{Index: tap.Index, Name: tap.Name, Alias: tap.Alias})
	if !errors.Is(err, link.ErrLinkChanged) {
		t.Fatalf("DeleteVerified after restamp = %v, want ErrLinkChanged", err)
	}
	if _, err := c.Get(ctx, tap.Index); err != nil {
		t.Fatalf("tap gone after a refused delete: %v", err)
	}

	renamed := readTap(t, c, name)
	ns.IP(t, "link", "set", name, "name", "renamed0")
	err = c.DeleteVerified(ctx, link.Expect{Index: renamed.Index, Name: renamed.Name, Alias: renamed.Alias})
	if !errors.Is(err, link.ErrLinkChanged) {
		t.Fatalf("DeleteVerified after rename = %v, want ErrLinkChanged", err)
	}

	l, _ := c.Get(ctx, tap.Index)
	if err := c.DeleteVerified(ctx, link.Expect{Index: l.Index, Name: l.Name, Alias: l.Alias}); err != nil {
		t.Fatalf("DeleteVerified of an unchanged link: %v", err)
	}
	err = c.DeleteVerified(ctx, link.Expect{Index: l.Index, Name: l.Name, Alias: l.Alias})
	if !errors.Is(err, link.ErrLinkGone) {
		t.Fatalf("second DeleteVerified = %v, want ErrLinkGone", err)
	}
	if _, err := c.GetByName(ctx, "nosuchlink"); !errors.Is(err, link.ErrLinkGone) {
		t.Fatalf("GetByName of a missing link = %v, want ErrLinkGone", err)
	}
}

func TestSetAppliesEveryFieldAtOnce(t *testing.T) {
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	ctx := context.Background()
	name := identity.Identity{VPC: 9, Attachment: 3}.TapName()
	nettest.NewTap(t, ns, name, tun.Mode{})
	ns.IP(t, "link", "add", "br0", "type", "bridge")
	br, err := c.GetByName(ctx, "br0")
	if err != nil {
		t.Fatal(err)
	}
	tap, _ := c.GetByName(ctx, name)
	alias, up, group := "owner", true, uint32(7)
	if err := c.Set(ctx, tap.Index, link.Change{Alias: &alias, Master: &br.Index, MTU: 1400, Up: &up, Group: &group}); err != nil {
		t.Fatal(err)
	}
	got, _ := c.Get(ctx, tap.Index)
	if got.Alias != alias || got.Master != br.Index || got.MTU != 1400 || !got.AdminUp || got.Group != group {
		t.Fatalf("after Set: %+v", got)
	}
	empty := ""
	if err := c.Set(ctx, tap.Index, link.Change{Alias: &empty}); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Get(ctx, tap.Index); got.Alias != "" {
		t.Fatalf("alias not cleared: %q", got.Alias)
	}
	if err := c.Set(ctx, 999999, link.Change{Up: &up}); !errors.Is(err, link.ErrLinkGone) {
		t.Fatalf("Set on a missing link = %v, want ErrLinkGone", err)
	}
}

func TestACancelledDumpReturnsPromptlyAndTheConnRecovers(t *testing.T) {
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Links(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Links with a cancelled context = %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	time.Sleep(time.Millisecond)
	if _, err := c.Links(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Links past its deadline = %v, want context.DeadlineExceeded", err)
	}
	if links, err := c.Links(context.Background()); err != nil || len(links) == 0 {
		t.Fatalf("Links after cancellations = %d links, %v", len(links), err)
	}
}

// TestADumpThatKeepsBeingInterruptedFails churns links while dumping with a
// single attempt allowed, until the kernel flags a dump as interrupted; the
// dump must then fail with ErrDumpInterrupted rather than return its links.
func TestADumpThatKeepsBeingInterruptedFails(t *testing.T) {
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	ctx := context.Background()
	for i := range 400 {
		nettest.NewTap(t, ns, identity.Identity{VPC: identity.VPC(i + 1), Attachment: 1}.TapName(), tun.Mode{})
	}
	// Registering and unregistering links moves the namespace's
	// dev_base_seq, which the kernel compares between the batches of a dump.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			f, err := tun.Open(ns.File, "churn0", tun.Mode{})
			if err != nil {
				t.Errorf("churn: %v", err)
				return
			}
			f.Close()
		}
	}()
	defer func() { close(stop); <-done }()

	c.SetDumpAttempts(1)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		_, err := c.Links(ctx)
		if errors.Is(err, link.ErrDumpInterrupted) {
			return
		}
		if err != nil {
			t.Fatalf("Links: %v", err)
		}
	}
	t.Fatal("no dump was flagged interrupted while links churned")
}

func TestDeleteGroupTakesExactlyTheGroupsLinks(t *testing.T) {
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	ctx := context.Background()
	const group = 0x6a1a0001
	var in, out []uint32
	for i := range 6 {
		name := identity.Identity{VPC: identity.VPC(i + 1), Attachment: 1}.TapName()
		nettest.NewTap(t, ns, name, tun.Mode{})
		l, err := c.GetByName(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			g := uint32(group)
			if err := c.Set(ctx, l.Index, link.Change{Group: &g}); err != nil {
				t.Fatal(err)
			}
			in = append(in, l.Index)
		} else {
			out = append(out, l.Index)
		}
	}
	if err := c.DeleteGroup(ctx, group); err != nil {
		t.Fatal(err)
	}
	for _, idx := range in {
		if _, err := c.Get(ctx, idx); !errors.Is(err, link.ErrLinkGone) {
			t.Errorf("link %d of the group: %v, want gone", idx, err)
		}
	}
	for _, idx := range out {
		if _, err := c.Get(ctx, idx); err != nil {
			t.Errorf("link %d outside the group: %v, want kept", idx, err)
		}
	}
	if err := c.DeleteGroup(ctx, 0); !errors.Is(err, link.ErrDefaultGroup) {
		t.Fatalf("DeleteGroup(0) = %v, want ErrDefaultGroup", err)
	}
	if links, _ := c.Links(ctx); len(links) != 1+len(out) {
		t.Fatalf("%d links left, want lo and %d taps", len(links), len(out))
	}
}
