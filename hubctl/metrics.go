package hubctl

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

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
	restored       prometheus.Counter
	refusals       *prometheus.CounterVec
	refusedNets    *prometheus.GaugeVec
	lease          prometheus.Gauge
	leaseKnown     prometheus.Gauge
	minLease       prometheus.Gauge
	held           prometheus.Gauge
	blind          prometheus.Gauge

	placementsWritten prometheus.Counter
	withdrawals       *prometheus.CounterVec
	placementRefusals *prometheus.CounterVec
	withdrawalsHeld   prometheus.Gauge
	placementsRefused prometheus.Gauge
	sweepPolicies     *prometheus.CounterVec
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
		restored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "galactic_hub_claims_restored_total",
			Help: "Claims made again at once for a live network whose claim the address service deleted in place of a gone network's (a server that does not check a delete's preconditions).",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_hub_claim_refusals_total",
			Help: "Networks whose claim the address service refused, counted once per network and cause, by class (configuration, exhausted) and cause.",
		}, []string{"class", "cause"}),
		refusedNets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "galactic_hub_networks_refused",
			Help: "Live networks whose claim is refused now, by class: configuration (retried slowly until someone changes it), exhausted (the pool has no block), quota.",
		}, []string{"class"}),
		lease: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_retention_lease_seconds",
			Help: "The address service's retention lease for the hub's claims: a released block is not reissued before this much time (plus the service's grace); 0 when there is none (never reissued).",
		}),
		leaseKnown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_retention_lease_known",
			Help: "1 when the last read of the retention lease succeeded, else 0 (releases are then held).",
		}),
		minLease: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_retention_lease_floor_seconds",
			Help: "The shortest retention lease under which the hub releases claims (--min-retention-lease).",
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_releases_held",
			Help: "1 while the leader releases no claim because the retention lease is shorter than the floor or cannot be read.",
		}),
		blind: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_claims_not_visible",
			Help: "1 while fabric identities exist but no claim or allocation is in view: the hub's credentials are likely not scoped to the platform project.",
		}),
		placementsWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "galactic_hub_placements_written_total",
			Help: "ClusterPropagationPolicies applied because a network's locations changed (a policy already as wanted is not written again).",
		}),
		withdrawals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_hub_placement_withdrawals_total",
			Help: "Placements withdrawn, by reason: moved (locations left a policy, others stay), no_location (the last context went: the policy deleted, the identity kept), collected (the network is gone).",
		}, []string{"reason"}),
		placementRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_hub_placement_refusals_total",
			Help: "Placements refused, counted once per network and cause: policy_taken (the policy's name is another's), location_name (a location that is no label value), label_key (placed, but no label key on the identity), refused (the API server refused the write).",
		}, []string{"cause"}),
		withdrawalsHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_placement_withdrawals_held",
			Help: "Live networks with a location that would be withdrawn but is held, because their contexts could not be read past the cache.",
		}),
		placementsRefused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "galactic_hub_placements_refused",
			Help: "Live networks whose placement is refused now, for any cause of galactic_hub_placement_refusals_total: not placed where they run, or not recorded on the identity.",
		}),
		sweepPolicies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "galactic_hub_startup_sweep_policies_total",
			Help: "Placement policies the startup sweep looked at, each counted once by result: live, removed (its network gone: collected), legacy_removed (the older per-location form), error.",
		}, []string{"result"}),
	}
	for _, r := range []string{WithdrawalMoved, WithdrawalNoLocation, WithdrawalCollected} {
		m.withdrawals.WithLabelValues(r)
	}
	for _, c := range []string{CausePolicyTaken, CauseLocationName, CauseLabelKey, CausePlacementRefused} {
		m.placementRefusals.WithLabelValues(c)
	}
	for _, r := range []string{"live", SweepPolicyRemoved, SweepPolicyLegacyRemoved, ReleaseError} {
		m.sweepPolicies.WithLabelValues(r)
	}
	for _, class := range []string{RefusalConfiguration, RefusalExhausted, RefusalQuota} {
		m.refusedNets.WithLabelValues(class)
	}
	for _, r := range []string{ReleaseReleased, ReleaseKept, ReleaseRefused, ReleaseError} {
		m.releases.WithLabelValues(r)
		m.sweep.WithLabelValues(r)
	}
	m.sweep.WithLabelValues("live")
	for _, c := range []prometheus.Collector{m.releases, m.refused, m.sweep, m.quotaRefusals, m.identitiesMade, m.unclaimed, m.leader,
		m.restored, m.refusals, m.refusedNets, m.lease, m.leaseKnown, m.minLease, m.held, m.blind,
		m.placementsWritten, m.withdrawals, m.placementRefusals, m.withdrawalsHeld, m.placementsRefused, m.sweepPolicies} {
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

// Restored exposes galactic_hub_claims_restored_total.
func Restored(m *Metrics) prometheus.Collector { return m.restored }

// Refusals exposes one class and cause of galactic_hub_claim_refusals_total.
func Refusals(m *Metrics, class, cause string) prometheus.Collector {
	return m.refusals.WithLabelValues(class, cause)
}

// NetworksRefused exposes one class of galactic_hub_networks_refused.
func NetworksRefused(m *Metrics, class string) prometheus.Collector {
	return m.refusedNets.WithLabelValues(class)
}

// ReleasesHeld exposes galactic_hub_releases_held.
func ReleasesHeld(m *Metrics) prometheus.Collector { return m.held }

// ClaimsNotVisible exposes galactic_hub_claims_not_visible.
func ClaimsNotVisible(m *Metrics) prometheus.Collector { return m.blind }

// RetentionLeaseSeconds exposes galactic_hub_retention_lease_seconds.
func RetentionLeaseSeconds(m *Metrics) prometheus.Collector { return m.lease }

// SetMinRetentionLease records the floor on its gauge.
func (m *Metrics) SetMinRetentionLease(d time.Duration) { m.minLease.Set(d.Seconds()) }

// Startup sweep results of placement policies, beside live and error.
const (
	SweepPolicyRemoved       = "removed"
	SweepPolicyLegacyRemoved = "legacy_removed"
)

// PlacementsWritten, Withdrawals, PlacementRefusals, WithdrawalsHeld and
// SweepPolicies expose the placement metrics for tests.
func PlacementsWritten(m *Metrics) prometheus.Collector { return m.placementsWritten }
func Withdrawals(m *Metrics, reason string) prometheus.Collector {
	return m.withdrawals.WithLabelValues(reason)
}
func PlacementRefusals(m *Metrics, cause string) prometheus.Collector {
	return m.placementRefusals.WithLabelValues(cause)
}
func WithdrawalsHeld(m *Metrics) prometheus.Collector   { return m.withdrawalsHeld }
func PlacementsRefused(m *Metrics) prometheus.Collector { return m.placementsRefused }
func SweepPolicies(m *Metrics, result string) prometheus.Collector {
	return m.sweepPolicies.WithLabelValues(result)
}
