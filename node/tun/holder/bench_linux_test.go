package holder_test

import (
	"context"
	"testing"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// BenchmarkProbeWindow measures the window a multiqueue tap keeps after its
// probe: from the start of the last read of its queue counts to the return
// of the verified delete, the time in which a VMM could still attach a
// queue and lose it. Peer: one bare RTM_GETLINK of the same tap
// ("getlink"), measured in the same run, since the window is a few netlink
// round trips. A single-queue tap has no such window: the probe's file
// holds its only queue until the delete.
func BenchmarkProbeWindow(b *testing.B) {
	nettest.RequirePrivileged(b)
	ns := nettest.NewNS(b)
	c := ns.Dial(b)
	ctx := context.Background()
	name := identity.Identity{VPC: 62, Attachment: 70}.TapName()
	b.Run("window", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			nettest.NewTap(b, ns, name, tun.Mode{})
			tp := readTap(b, c, name)
			claim, err := holder.Prober{NS: ns.File, Links: c}.Claim(ctx, tp)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			last, err := c.Get(ctx, tp.Index)
			if err != nil {
				b.Fatal(err)
			}
			if held, why := claim.HeldByOthers(last); held {
				b.Fatal(why)
			}
			if err := c.DeleteVerified(ctx, link.Expect{Index: tp.Index, Name: tp.Name, Alias: tp.Alias}); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			claim.Release()
			b.StartTimer()
		}
	})
	b.Run("getlink", func(b *testing.B) {
		nettest.NewTap(b, ns, name, tun.Mode{})
		index := readTap(b, c, name).Index
		for b.Loop() {
			if _, err := c.Get(ctx, index); err != nil {
				b.Fatal(err)
			}
		}
	})
}
