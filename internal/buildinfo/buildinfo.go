// Package buildinfo says which build a binary is: its version (from the
// linker flags, else from the module's build information) and its VCS
// revision, and exports both as the galactic_build_info metric.
package buildinfo

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Version is ldflags, the version the linker flags set (make and the image
// build set it), unless that is empty or "dev": then the version Go
// recorded for the main module, so that a plain go build or go install
// still says which commit it is.
func Version(ldflags string) string {
	if ldflags != "" && ldflags != "dev" {
		return ldflags
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	return fromBuild(bi)
}

func fromBuild(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, modified := vcs(bi)
	switch {
	case rev == "":
		return "dev"
	case modified:
		return rev + "-dirty"
	}
	return rev
}

// Revision is the VCS revision the binary was built from, or "unknown"
// when Go recorded none (a build outside the repository, or -buildvcs=false).
func Revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		if rev, _ := vcs(bi); rev != "" {
			return rev
		}
	}
	return "unknown"
}

func vcs(bi *debug.BuildInfo) (revision string, modified bool) {
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	return revision, modified
}

// Collector is the gauge galactic_build_info, always 1, labelled with the
// binary's version, revision and Go version: a dashboard joins on it to
// tell which build each target runs.
func Collector(version string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "galactic_build_info",
		Help:        "Always 1; the labels say which build this process runs.",
		ConstLabels: prometheus.Labels{"version": version, "revision": Revision(), "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}
