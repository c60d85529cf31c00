package hubctl

import "github.com/prometheus/client_golang/prometheus"

// Release results, the values of the result label.
const (
	ReleaseReleased = "released" // the claim is gone: its quota unit is back
	ReleaseKept     = "kept"     // kept on purpose: allocation missing or not Retain
	ReleaseRefused  = "refused"  // the API server refused the delete
	ReleaseError    = "error"    // the attempt failed; retried
)

// Metrics are the controller's Prometheus metrics.
type Metrics struct {
	releases       *prometheus.CounterVec
	refused        prometheus.Gauge
	sweep          *prometheus.CounterVec
	quotaRefusals  prometheus.Counter
	identitiesMade prometheus.Counter
	unclaimed      prometheus.Gauge
	leader         prometheus.Gauge
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_hub_claim_releases_total",
			Help: "Fabric-identity claim releases of gone networks outside the startup sweep, by result: released (a claim deleted), kept and refused (a claim first held up so), error (each failed attempt).",
		}, []string{"result"}),
		refused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_claims_release_refused",
			Help: "Claims of gone networks whose release is currently kept or refused. Above 0 for long: quota units are leaking.",
		}),
		sweep: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_hub_startup_sweep_claims_total",
			Help: "Fabric-identity claims the startup sweep looked at, each counted once by result: live, released, kept, refused, error.",
		}, []string{"result"}),
		quotaRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "galactic_hub_claim_quota_refusals_total",
			Help: "Creates of fabric-identity claims refused by the platform's quota on claims, one per refused create.",
		}),
		identitiesMade: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "galactic_hub_identities_written_total",
			Help: "NetworkFabricIdentities this instance created (an identity found existing is not counted).",
		}),
		unclaimed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_unclaimed_blocks",
			Help: "Blocks held by live networks that hold no claim (adopted after 409 AllocationRetained): they count against no quota.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_leader",
			Help: "1 while this instance leads (holds the leader Lease and reconciles), else 0. The max over replicas is 0 when replicas are up but none leads.",
		}),
	}
	for _, r := range []string{ReleaseReleased, ReleaseKept, ReleaseRefused, ReleaseError} {
		m.releases.WithLabelValues(r)
		m.sweep.WithLabelValues(r)
	}
	m.sweep.WithLabelValues("live")
	for _, c := range []prometheus.Collector{m.releases, m.refused, m.sweep, m.quotaRefusals, m.identitiesMade, m.unclaimed, m.leader} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// QuotaRefusals and IdentitiesWritten expose single metrics for tests and
// dashboards built in Go.
func QuotaRefusals(m *Metrics) prometheus.Collector     { return m.quotaRefusals }
func IdentitiesWritten(m *Metrics) prometheus.Collector { return m.identitiesMade }

// Releases exposes one result of galactic_hub_claim_releases_total.
func Releases(m *Metrics, result string) prometheus.Collector {
	return m.releases.WithLabelValues(result)
}

// UnclaimedBlocks exposes galactic_hub_unclaimed_blocks.
func UnclaimedBlocks(m *Metrics) prometheus.Collector { return m.unclaimed }

// Leader exposes galactic_hub_leader.
func Leader(m *Metrics) prometheus.Collector { return m.leader }
