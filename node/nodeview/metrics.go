package nodeview

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
)

// mapCollector reports the rows and the capacity of every pinned map at
// each scrape: a map that fills makes every ADD fail. It also reports the
// frames the program could not count against their tenant because the
// decisions map was full: they were still judged, but their tenant's
// counters miss them.
type mapCollector struct {
	views            *Views
	entries, maxRows *prometheus.Desc
	overflow         *prometheus.Desc
	holderScan       *prometheus.Desc
	otherProgram     *prometheus.Desc
}

// MapCollector returns a collector of galactic_ebpf_map_entries{map},
// galactic_ebpf_map_max_entries{map},
// galactic_ebpf_decisions_overflow_total,
// galactic_ebpf_taps_on_other_program and
// galactic_cni_holder_scan_complete (from a scan at most 30 s old).
func (v *Views) MapCollector() prometheus.Collector {
	return &mapCollector{
		views:   v,
		entries: prometheus.NewDesc("galactic_ebpf_map_entries", "Rows in each pinned eBPF map of the datapath.", []string{"map"}, nil),
		maxRows: prometheus.NewDesc("galactic_ebpf_map_max_entries", "Capacity of each pinned eBPF map of the datapath.", []string{"map"}, nil),
		overflow: prometheus.NewDesc("galactic_ebpf_decisions_overflow_total",
			"Frames judged but counted against no tenant because the decisions map was full (unattributed, reason decisions_full).", nil, nil),
		holderScan: prometheus.NewDesc("galactic_cni_holder_scan_complete",
			"1 when the /proc scan that names tap holders saw every process, 0 when it may miss some (see /v1/status holderScan.reason). Removals never depend on it.", nil, nil),
		otherProgram: prometheus.NewDesc("galactic_ebpf_taps_on_other_program",
			"Attached interfaces whose TCX link runs another program than the daemon's (an older build's): the daemon moves them at start and after each pass.", nil, nil),
	}
}

func (c *mapCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.entries
	ch <- c.maxRows
	ch <- c.overflow
	ch <- c.holderScan
	ch <- c.otherProgram
}

func (c *mapCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.views.Datapath.Tables() {
		l := t.Layout()
		ch <- prometheus.MustNewConstMetric(c.maxRows, prometheus.GaugeValue, float64(l.MaxEntries), l.Name)
		rows, err := t.DumpAny(0)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.entries, err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(len(rows)), l.Name)
	}
	complete := 0.0
	if c.views.HolderScan(context.Background()).Complete {
		complete = 1
	}
	ch <- prometheus.MustNewConstMetric(c.holderScan, prometheus.GaugeValue, complete)
	if st := c.views.Programs(); st.Error != "" {
		ch <- prometheus.NewInvalidMetric(c.otherProgram, errors.New(st.Error))
	} else {
		ch <- prometheus.MustNewConstMetric(c.otherProgram, prometheus.GaugeValue, float64(st.OnOther))
	}
	// The count lives in the pinned map, so it survives daemon restarts
	// and only grows: a counter.
	if n, err := c.views.Datapath.Unattributed.Get(datapath.ReasonDecisionsFull); err != nil {
		ch <- prometheus.NewInvalidMetric(c.overflow, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.overflow, prometheus.CounterValue, float64(n))
	}
}
