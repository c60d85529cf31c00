package attachreg_test

import (
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// BenchmarkOrphanScan16384Rows lists every registered interface (the
// orphan collection's scan: one batch dump of each per-interface map, the
// ifindex_vrf identities and the link pins) over 16,384 ifindex_vrf rows,
// 1% of them orphans (no live ifindex), and picks out the orphans; the peer,
// in the same run, is one batch dump of the same maps.
func BenchmarkOrphanScan16384Rows(b *testing.B) {
	const rows = 16384
	d, err := datapath.Load(nettest.BPFFS(b))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	live := make(map[uint32]bool, rows)
	for i := uint32(1); i <= rows; i++ {
		if err := d.IfindexVRF.Put(i, datapath.VRFBinding{Table: 1000, VPC: datapath.VPC(62 + i/1000), Attachment: datapath.Attachment(i % 1000)}); err != nil {
			b.Fatal(err)
		}
		if i%100 != 0 {
			live[i] = true
		}
	}
	reg := attachreg.New(d, nil, nil)
	var peer time.Duration
	for b.Loop() {
		regs, err := reg.Registered()
		if err != nil {
			b.Fatal(err)
		}
		orphans := 0
		for _, r := range regs {
			if !live[r.Ifindex] {
				orphans++
			}
		}
		if orphans != rows/100 {
			b.Fatalf("%d orphans, want %d", orphans, rows/100)
		}
		b.StopTimer()
		start := time.Now()
		for _, name := range reg.PerInterfaceMaps() {
			if _, err := reg.Dump(name, 0); err != nil {
				b.Fatal(err)
			}
		}
		peer += time.Since(start)
		b.StartTimer()
	}
	b.StopTimer()
	ours := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	peerNs := float64(peer.Nanoseconds()) / float64(b.N)
	b.ReportMetric(peerNs, "batch-dump-ns/op")
	b.ReportMetric(ours/peerNs, "x-of-batch-dump")
}
