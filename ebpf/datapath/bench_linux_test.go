package datapath_test

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// BenchmarkDump16384Rows dumps 16,384 ifindex_vrf rows by batch look-up and
// by iteration, and times `bpftool map dump pinned` of the same map in the
// same run as the peer. x-of-bpftool is each one's ratio to the peer.
func BenchmarkDump16384Rows(b *testing.B) {
	const rows = 16384
	bpftool := ensureBpftool(b)
	d, err := datapath.Load(nettest.BPFFS(b))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	for i := uint32(1); i <= rows; i++ {
		if err := d.IfindexVRF.Put(i, datapath.VRFBinding{Table: 1000 + i, VPC: 62, Attachment: 1}); err != nil {
			b.Fatal(err)
		}
	}
	pin := filepath.Join(d.PinDir(), "ifindex_vrf")

	for _, mode := range []struct {
		name string
		dump func(int) ([]datapath.Row[uint32, datapath.VRFBinding], error)
	}{{"batch", d.IfindexVRF.Dump}, {"iterate", d.IfindexVRF.DumpIterate}} {
		b.Run(mode.name, func(b *testing.B) {
			var peer time.Duration
			for b.Loop() {
				got, err := mode.dump(0)
				if err != nil || len(got) != rows {
					b.Fatalf("%d rows, %v", len(got), err)
				}
				b.StopTimer()
				start := time.Now()
				if out, err := exec.Command(bpftool, "map", "dump", "pinned", pin).CombinedOutput(); err != nil {
					b.Fatalf("bpftool: %v: %.200s", err, out)
				}
				peer += time.Since(start)
				b.StartTimer()
			}
			b.StopTimer()
			ours := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			peerNs := float64(peer.Nanoseconds()) / float64(b.N)
			b.ReportMetric(peerNs, "bpftool-ns/op")
			b.ReportMetric(ours/peerNs, "x-of-bpftool")
			b.ReportMetric(ours/rows, "ns/row")
		})
	}
}

// ensureBpftool finds bpftool, installing Debian's package if it is missing.
func ensureBpftool(b *testing.B) string {
	b.Helper()
	if p, err := exec.LookPath("bpftool"); err == nil {
		return p
	}
	b.Log("bpftool missing: installing Debian's bpftool")
	if out, err := exec.Command("sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bpftool").CombinedOutput(); err != nil {
		b.Fatalf("install bpftool: %v: %s", err, out)
	}
	p, err := exec.LookPath("bpftool")
	if err != nil {
		b.Fatal(err)
	}
	return p
}
