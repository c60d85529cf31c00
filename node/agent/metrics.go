package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// mapCollector reports the rows and the capacity of every pinned map at
// each scrape: a map that fills makes every ADD fail.
type mapCollector struct {
	a                *Agent
	entries, maxRows *prometheus.Desc
}

// MapCollector returns a collector of galactic_ebpf_map_entries{map} and
// galactic_ebpf_map_max_entries{map}.
func (a *Agent) MapCollector() prometheus.Collector {
	return &mapCollector{
		a:       a,
		entries: prometheus.NewDesc("galactic_ebpf_map_entries", "Rows in each pinned eBPF map of the datapath.", []string{"map"}, nil),
		maxRows: prometheus.NewDesc("galactic_ebpf_map_max_entries", "Capacity of each pinned eBPF map of the datapath.", []string{"map"}, nil),
	}
}

func (c *mapCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.entries
	ch <- c.maxRows
}

func (c *mapCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.a.Datapath.Tables() {
		l := t.Layout()
		ch <- prometheus.MustNewConstMetric(c.maxRows, prometheus.GaugeValue, float64(l.MaxEntries), l.Name)
		rows, err := t.DumpAny(0)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.entries, err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(len(rows)), l.Name)
	}
}
