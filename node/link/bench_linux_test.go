package link_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// BenchmarkDump1000Taps reads 1,000 tenant taps with one dump and, in the
// same run and namespace, times `ip -d -o link show` as the peer. ns/op is
// this package's dump plus tap views; ip-ns/op is the peer's; x-of-ip is
// their ratio (below 1 is faster than ip). The machine is shared, so only
// the ratio is meant to be compared across runs.
func BenchmarkDump1000Taps(b *testing.B) {
	const taps = 1000
	ns := nettest.NewNS(b)
	for i := range taps {
		nettest.NewTap(b, ns, identity.Identity{VPC: identity.VPC(i + 1), Attachment: 1}.TapName(), tun.Mode{})
	}
	c := ns.Dial(b)
	ctx := context.Background()
	var ipTime time.Duration
	b.ResetTimer()
	for b.Loop() {
		links, err := c.Links(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(link.TenantTaps(links)); n != taps {
			b.Fatalf("%d taps, want %d", n, taps)
		}

		b.StopTimer()
		start := time.Now()
		if out, err := exec.Command("ip", "-n", ns.Name, "-d", "-o", "link", "show").CombinedOutput(); err != nil {
			b.Fatalf("ip link show: %v: %s", err, out)
		}
		ipTime += time.Since(start)
		b.StartTimer()
	}
	b.StopTimer()
	ours := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	peer := float64(ipTime.Nanoseconds()) / float64(b.N)
	b.ReportMetric(peer, "ip-ns/op")
	b.ReportMetric(ours/peer, "x-of-ip")
	b.ReportMetric(ours/taps, "ns/tap")
}
