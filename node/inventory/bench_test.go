package inventory

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// BenchmarkFileInventory100000Identities loads an inventory of 100,000
// VPCAttachments (the file source: the informer source caches the same
// trimmed Objects) and reports the heap it keeps and the time of a
// Snapshot, the per-pass cost. API requests per pass are measured against
// a real API server in node/reclaim (BenchmarkAPIRequestsPerSteadyStatePass).
func BenchmarkFileInventory100000Identities(b *testing.B) {
	const n = 100000
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, "---\napiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: att-%d, namespace: tenant-%d}\nstatus: {vpc: \"%d\", vpcAttachment: \"%d\"}\n",
			i, i%100, 1+i/1000, i%1000)
	}
	path := filepath.Join(b.TempDir(), "inventory.yaml")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f := NewFile(path)
	snap := f.Snapshot(context.Background())
	if err := snap.Healthy(); err != nil || snap.Identities() != n {
		b.Fatalf("snapshot: %d identities, %v", snap.Identities(), err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	for b.Loop() {
		s := f.Snapshot(context.Background())
		if s.Identities() != n {
			b.Fatal("lost identities")
		}
	}
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/(1<<20), "heap-MiB")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e6, "snapshot-ms")
	runtime.KeepAlive(snap)
}
