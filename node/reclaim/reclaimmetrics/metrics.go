// Package reclaimmetrics exports what the reclaim observes (passes,
// removals, failures by stage, pending candidates, malformed objects,
// cleared orphans), the daemon's reclaim configuration and the inventory's
// age as Prometheus metrics. It is apart from node/reclaim so that the
// reclaim links no metrics library: it implements reclaim.Observer.
package reclaimmetrics

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// Metrics are the reclaim's Prometheus metrics; they implement
// reclaim.Observer.
type Metrics struct {
	pending      prometheus.Gauge
	reclaimed    prometheus.Counter
	failures     *prometheus.CounterVec
	passes       *prometheus.CounterVec
	passDuration prometheus.Histogram
	lastPass     prometheus.Gauge
	malformed    *prometheus.GaugeVec
	orphanRows   *prometheus.CounterVec
	dryRun       prometheus.Gauge
	interval     prometheus.Gauge
	brake        prometheus.Gauge
	brakeHeld    prometheus.Gauge
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_cni_stale_taps_pending",
			Help: "Stale tap candidates awaiting confirmation by the next pass. Stuck above 0 means removals are failing or rolling over.",
		}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "galactic_cni_stale_taps_reclaimed_total",
			Help: "Stale taps removed, with their eBPF rows and routes.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_cni_stale_tap_reclaim_failures_total",
			Help: "Confirmed stale taps that could not be removed, by the stage that failed; they are retried by a later pass.",
		}, []string{"stage"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_cni_stale_tap_passes_total",
			Help: "Reclaim passes, by result: completed, skipped (inputs not trustworthy, nothing removed), failed.",
		}, []string{"result"}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "galactic_cni_stale_tap_pass_duration_seconds",
			Help:    "Duration of reclaim passes.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_cni_stale_tap_last_completed_pass_timestamp_seconds",
			Help: "Unix time at which the last completed reclaim pass finished.",
		}),
		// Labelled by kind only: an object's namespace and name are the
		// tenant's, as many as it makes, and every node would export each
		// (the pass report names a sample).
		malformed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "galactic_cni_inventory_malformed_objects",
			Help: "Objects of each kind (VPCAttachment, BGPAdvertisement) in the last pass's inventory whose identity fields are set but cannot be read; the pass report (inputs.malformedSample) names up to 10.",
		}, []string{"kind"}),
		orphanRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_cni_orphan_ebpf_rows_removed_total",
			Help: "eBPF rows (and, as map=\"tcx_link\", TCX link pins) of interfaces deleted behind the node's back, and (map=\"decisions\") decision counters of identities no interface names, cleared by the orphan collection.",
		}, []string{"map"}),
		brake: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_cni_mass_removal_brake_engaged",
			Help: "1 while the mass-removal brake holds: too many taps found stale at once, or the cluster's inventory shrank sharply, so passes remove nothing until an operator runs `galactic-node pass --allow-mass-removal` or the inventory stays stable for --mass-removal-release-after.",
		}),
		brakeHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_cni_mass_removal_brake_held_taps",
			Help: "Confirmed stale taps the mass-removal brake kept in the last pass; 0 while it is not engaged.",
		}),
		// The daemon's configuration, set by SetConfig.
		dryRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_cni_stale_tap_dry_run",
			Help: "1 when the daemon runs with --dry-run: every pass removes nothing, so stale taps stay pending on purpose.",
		}),
		interval: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_cni_stale_tap_pass_interval_seconds",
			Help: "Seconds between periodic reclaim passes (--interval); 0 when passes run only when forced.",
		}),
	}
	for _, s := range []reclaim.Stage{reclaim.StageLock, reclaim.StageVerify, reclaim.StageProbe, reclaim.StageRows, reclaim.StageLink} {
		m.failures.WithLabelValues(string(s))
	}
	for _, r := range []reclaim.Result{reclaim.ResultCompleted, reclaim.ResultSkipped, reclaim.ResultFailed} {
		m.passes.WithLabelValues(string(r))
	}
	m.Malformed(reclaim.MalformedCount{})
	for _, c := range []prometheus.Collector{m.pending, m.reclaimed, m.failures, m.passes, m.passDuration, m.lastPass, m.malformed, m.orphanRows, m.dryRun, m.interval, m.brake, m.brakeHeld} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// SetConfig exports the daemon's --dry-run and --interval (0: passes only
// when forced), which the alerts need to tell a node that removes nothing on
// purpose from one that fails to, and to scale "no pass for long" to the
// interval.
func (m *Metrics) SetConfig(dryRun bool, interval time.Duration) {
	v := 0.0
	if dryRun {
		v = 1
	}
	m.dryRun.Set(v)
	m.interval.Set(max(interval, 0).Seconds())
}

// SetBrake exports the brake's state outside a pass: at start, from the
// memory a restart found.
func (m *Metrics) SetBrake(engaged bool, held int) {
	v := 0.0
	if engaged {
		v = 1
	}
	m.brake.Set(v)
	m.brakeHeld.Set(float64(held))
}

var _ reclaim.Observer = (*Metrics)(nil)

// Malformed implements reclaim.Observer: both kinds' counts are always
// exported, 0 included, so that an alert or a dashboard reads a series
// rather than its absence.
func (m *Metrics) Malformed(c reclaim.MalformedCount) {
	m.malformed.WithLabelValues(inventory.AttachmentKind).Set(float64(c.Attachments))
	m.malformed.WithLabelValues(inventory.AdvertisementKind).Set(float64(c.Advertisements))
}

// PassDone implements reclaim.Observer.
func (m *Metrics) PassDone(rep reclaim.Report, pending int) {
	m.pending.Set(float64(pending))
	m.reclaimed.Add(float64(len(rep.Reclaimed)))
	for _, f := range rep.Failed {
		m.failures.WithLabelValues(string(f.Stage)).Inc()
	}
	m.passes.WithLabelValues(string(rep.Result)).Inc()
	// A preview's brake is what a real pass would meet (engaged or
	// released) and changes none of the brake's state: the gauges keep
	// saying what holds. A daemon in dry-run engages its brake for real.
	if !rep.Preview {
		engaged, held := 0.0, 0.0
		if b := rep.Brake; b != nil && b.Engaged {
			engaged, held = 1, float64(b.Held)
		}
		m.brake.Set(engaged)
		m.brakeHeld.Set(held)
	}
	m.passDuration.Observe(rep.Finished.Sub(rep.Started).Seconds())
	if rep.Result == reclaim.ResultCompleted {
		m.lastPass.Set(float64(rep.Finished.UnixNano()) / 1e9)
	}
}

// OrphanRowsCleared implements reclaim.Observer.
func (m *Metrics) OrphanRowsCleared(mapName string, n int) {
	m.orphanRows.WithLabelValues(mapName).Add(float64(n))
}

// RegisterInventoryAge registers galactic_cni_inventory_age_seconds on reg:
// the seconds since the newest consistent read of the API server that
// succeeded started (inventory.Prover's ProvenAt), +Inf before the first. A
// partitioned node's reads fail, and a slow API server's start long before
// they end, so the age grows in both.
func RegisterInventoryAge(reg prometheus.Registerer, p inventory.Proven) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "galactic_cni_inventory_age_seconds",
		Help: "Seconds since the start of the newest consistent read of the API server that succeeded (a removing pass's, or the daemon's probe every quarter of --inventory-max-age); watch events do not count; +Inf before the first.",
	}, func() float64 {
		at := p.ProvenAt()
		if at.IsZero() {
			return math.Inf(1)
		}
		return time.Since(at).Seconds()
	}))
}
