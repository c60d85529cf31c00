// Package buildmetric exports which build a daemon runs as the
// galactic_build_info metric. It is apart from internal/buildinfo so that a
// binary with no metrics server (the CNI plugin) links no Prometheus client.
package buildmetric

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/datum-cloud/galactic-node/internal/buildinfo"
)

// Collector is the gauge galactic_build_info, always 1, labelled with the
// binary's version, revision and Go version: a dashboard joins on it to
// tell which build each target runs.
func Collector(version string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "galactic_build_info",
		Help:        "Always 1; the labels say which build this process runs.",
		ConstLabels: prometheus.Labels{"version": version, "revision": buildinfo.Revision(), "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}
