package connlimit

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the metrics of l, labelled listener=name: the
// connections open now and those refused so far. They live here, not in
// the daemon's main package, so that the dashboard and alert tests can
// list every metric the daemon exports from the collectors themselves.
func (l *Listener) Collectors(name string) []prometheus.Collector {
	labels := prometheus.Labels{"listener": name}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "galactic_listener_connections", ConstLabels: labels,
			Help: "Connections open on a listener of the daemon."}, func() float64 { return float64(l.Open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "galactic_listener_connections_refused_total", ConstLabels: labels,
			Help: "Connections closed unread because the listener was at its connection bound, in total or for the peer's address."},
			func() float64 { return float64(l.Refused()) }),
	}
}
