package nodeview

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
)

// DropCounters is where the node's frame counters come from: the program's
// node-wide totals by decision, and the records of dropped frames it could
// not hand over. The datapath's state maps implement it; nil reports none.
type DropCounters interface {
	DecisionTotals() (map[datapath.Decision]uint64, error)
	DropRecordsLost() (ringFull, rateLimited uint64, err error)
}

// decisionCollector reports what the program decided about frames, node
// wide and with bounded labels only (no tenant, no tap: `galactic-node taps`
// and /v1/taps name those), and what became of the drop records.
type decisionCollector struct {
	views                       *Views
	decisions, unattributed     *prometheus.Desc
	recordsLost                 *prometheus.Desc
	recordsRead, recordsMissed  *prometheus.Desc
	followers, monitorAvailable *prometheus.Desc
	unbound                     *prometheus.Desc
}

// DecisionCollector returns a collector of
// galactic_ebpf_decisions_total{decision},
// galactic_ebpf_unattributed_total{reason},
// galactic_ebpf_drop_records_lost_total{reason},
// galactic_node_drop_records_read_total,
// galactic_node_drop_records_missed_total,
// galactic_node_drop_followers, galactic_node_drop_monitor_available and
// galactic_ebpf_taps_unbound.
func (v *Views) DecisionCollector() prometheus.Collector {
	return &decisionCollector{
		views: v,
		decisions: prometheus.NewDesc("galactic_ebpf_decisions_total",
			"Frames the tap program judged on this node, by decision (allow, deny, host_only, malformed, spoofed). Lives in pinned state: survives daemon restarts, resets when a build with another state layout loads.",
			[]string{"decision"}, nil),
		unattributed: prometheus.NewDesc("galactic_ebpf_unattributed_total",
			"Frames counted against no tenant, by reason: policy_unavailable (dropped: the tap had no rules), identity_unavailable (older builds' programs), decisions_full (judged, but the decisions map had no room for the tenant).",
			[]string{"reason"}, nil),
		recordsLost: prometheus.NewDesc("galactic_ebpf_drop_records_lost_total",
			"Records of dropped frames the program did not write, by reason: ring_full (no reader kept up, or none ran), rate_limited (the tap's per-second budget was spent).",
			[]string{"reason"}, nil),
		recordsRead: prometheus.NewDesc("galactic_node_drop_records_read_total",
			"Records of dropped frames the daemon read from the program since it started.", nil, nil),
		recordsMissed: prometheus.NewDesc("galactic_node_drop_records_missed_total",
			"Records of dropped frames that followers of GET /v1/drops?follow=true missed by reading too slowly.", nil, nil),
		followers: prometheus.NewDesc("galactic_node_drop_followers",
			"Live feeds of GET /v1/drops?follow=true now.", nil, nil),
		unbound: prometheus.NewDesc("galactic_ebpf_taps_unbound",
			"Taps taken over from an older build that no record of their ADD could bind to their MAC and addresses: anti-spoofing is off for them until an ADD registers them (galactic-node taps: BOUND).", nil, nil),
		monitorAvailable: prometheus.NewDesc("galactic_node_drop_monitor_available",
			"1 when the daemon reads the program's records of dropped frames, 0 when it cannot (/v1/drops says why).", nil, nil),
	}
}

func (c *decisionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.decisions, c.unattributed, c.recordsLost, c.recordsRead, c.recordsMissed, c.followers, c.monitorAvailable, c.unbound} {
		ch <- d
	}
}

func (c *decisionCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.views
	if v.Counters != nil {
		if totals, err := v.Counters.DecisionTotals(); err != nil {
			ch <- prometheus.NewInvalidMetric(c.decisions, err)
		} else {
			for _, d := range datapath.Decisions {
				ch <- prometheus.MustNewConstMetric(c.decisions, prometheus.CounterValue, float64(totals[d]), d.String())
			}
		}
		if full, limited, err := v.Counters.DropRecordsLost(); err != nil {
			ch <- prometheus.NewInvalidMetric(c.recordsLost, err)
		} else {
			ch <- prometheus.MustNewConstMetric(c.recordsLost, prometheus.CounterValue, float64(full), "ring_full")
			ch <- prometheus.MustNewConstMetric(c.recordsLost, prometheus.CounterValue, float64(limited), "rate_limited")
		}
	}
	if v.Datapath != nil {
		if unbound, err := v.unboundTaps(); err != nil {
			ch <- prometheus.NewInvalidMetric(c.unbound, err)
		} else {
			ch <- prometheus.MustNewConstMetric(c.unbound, prometheus.GaugeValue, float64(len(unbound)))
		}
		for _, r := range []datapath.Reason{datapath.ReasonPolicyUnavailable, datapath.ReasonIdentityUnavailable, datapath.ReasonDecisionsFull} {
			if n, err := v.Datapath.Unattributed.Get(r); err != nil {
				ch <- prometheus.NewInvalidMetric(c.unattributed, err)
			} else {
				ch <- prometheus.MustNewConstMetric(c.unattributed, prometheus.CounterValue, float64(n), r.String())
			}
		}
	}
	available := 0.0
	if v.Drops != nil {
		available = 1
		st := v.Drops.Stats()
		ch <- prometheus.MustNewConstMetric(c.recordsRead, prometheus.CounterValue, float64(st.Read))
		ch <- prometheus.MustNewConstMetric(c.recordsMissed, prometheus.CounterValue, float64(st.Missed))
		ch <- prometheus.MustNewConstMetric(c.followers, prometheus.GaugeValue, float64(st.Followers))
	}
	ch <- prometheus.MustNewConstMetric(c.monitorAvailable, prometheus.GaugeValue, available)
}
