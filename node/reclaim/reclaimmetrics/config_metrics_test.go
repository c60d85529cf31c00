package reclaimmetrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestConfigGaugesSayTheDaemonsConfig: the alerts read --dry-run and
// --interval from these gauges (deploy/alerts/galactic.rules.yaml), so they
// must say what the daemon was given, an interval of 0 included.
func TestConfigGaugesSayTheDaemonsConfig(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if testutil.ToFloat64(m.dryRun) != 0 || testutil.ToFloat64(m.interval) != 0 {
		t.Fatal("the gauges are not 0 before SetConfig")
	}
	for _, tc := range []struct {
		dryRun   bool
		interval time.Duration
		wantDry  float64
	}{{false, time.Minute, 0}, {true, 10 * time.Minute, 1}, {false, 0, 0}} {
		m.SetConfig(tc.dryRun, tc.interval)
		if got := testutil.ToFloat64(m.dryRun); got != tc.wantDry {
			t.Errorf("dry-run %v: galactic_cni_stale_tap_dry_run = %v, want %v", tc.dryRun, got, tc.wantDry)
		}
		if got := testutil.ToFloat64(m.interval); got != tc.interval.Seconds() {
			t.Errorf("interval %v: galactic_cni_stale_tap_pass_interval_seconds = %v, want %v", tc.interval, got, tc.interval.Seconds())
		}
	}
}
