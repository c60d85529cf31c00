package reclaimmetrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// A preview's brake is what a real pass would meet: a preview that would
// engage it, or release it, changes neither gauge, which the brake alert reads; a real
// braked pass sets both, and its held taps count as confirmed, not as
// reclaimed.
func TestADryRunMovesNoBrakeGauge(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	held := []reclaim.TapRef{{Name: "a", Ifindex: 1}, {Name: "b", Ifindex: 2}, {Name: "c", Ifindex: 3}}
	braked := reclaim.Report{Started: now, Finished: now, Result: reclaim.ResultCompleted, Confirmed: held, Held: held,
		Brake: &reclaim.BrakeReport{Engaged: true, Held: 3}}
	preview := braked
	preview.DryRun, preview.Preview = true, true
	m.PassDone(preview, 3)
	if e, h := testutil.ToFloat64(m.brake), testutil.ToFloat64(m.brakeHeld); e != 0 || h != 0 {
		t.Fatalf("after a dry run that would brake: engaged %v held %v, want 0 0", e, h)
	}
	m.PassDone(braked, 3)
	if e, h, r := testutil.ToFloat64(m.brake), testutil.ToFloat64(m.brakeHeld), testutil.ToFloat64(m.reclaimed); e != 1 || h != 3 || r != 0 {
		t.Fatalf("after a braked pass: engaged %v held %v reclaimed %v, want 1 3 0", e, h, r)
	}
	released := reclaim.Report{Started: now, Finished: now, Result: reclaim.ResultCompleted, DryRun: true, Preview: true,
		Brake: &reclaim.BrakeReport{Released: "by an operator"}}
	m.PassDone(released, 0)
	if e := testutil.ToFloat64(m.brake); e != 1 {
		t.Fatalf("a dry run previewing a release cleared the engaged gauge: %v", e)
	}
}
