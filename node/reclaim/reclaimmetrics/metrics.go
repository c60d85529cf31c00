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
		malformed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "galactic_cni_inventory_malformed_objects",
			Help: "1 for each object, named by its labels, whose identity fields are set but cannot be read; while any is listed, passes remove nothing.",
		}, []string{"kind", "namespace", "name"}),
		orphanRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_cni_orphan_ebpf_rows_removed_total",
			Help: "eBPF rows (and, as map=\"tcx_link\", TCX link pins) of interfaces deleted behind the node's back, and (map=\"decisions\") decision counters of identities no interface names, cleared by the orphan collection.",
		}, []string{"map"}),
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
	for _, c := range []prometheus.Collector{m.pending, m.reclaimed, m.failures, m.passes, m.passDuration, m.lastPass, m.malformed, m.orphanRows, m.dryRun, m.interval} {
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

var _ reclaim.Observer = (*Metrics)(nil)

// Malformed implements reclaim.Observer: it lists exactly the objects of the
// last snapshot that could not be read.
func (m *Metrics) Malformed(refs []inventory.ObjectRef) {
	m.malformed.Reset()
	for _, o := range refs {
		m.malformed.WithLabelValues(o.Kind, o.Namespace, o.Name).Set(1)
	}
}

// PassDone implements reclaim.Observer.
func (m *Metrics) PassDone(rep reclaim.Report, pending int) {
	m.pending.Set(float64(pending))
	m.reclaimed.Add(float64(len(rep.Reclaimed)))
	for _, f := range rep.Failed {
		m.failures.WithLabelValues(string(f.Stage)).Inc()
	}
	m.passes.WithLabelValues(string(rep.Result)).Inc()
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
// the seconds since p last showed itself as new as the API server (a
// consistent read, a list or a watch event), +Inf before the first time. A
// partitioned node's informers hear nothing, so the age grows.
func RegisterInventoryAge(reg prometheus.Registerer, p inventory.Prover) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "galactic_cni_inventory_age_seconds",
		Help: "Seconds since the inventory was last proven as new as the API server (a consistent read, a list or a watch event, bookmarks included); +Inf before the first.",
	}, func() float64 {
		at := p.ProvenAt()
		if at.IsZero() {
			return math.Inf(1)
		}
		return time.Since(at).Seconds()
	}))
}
