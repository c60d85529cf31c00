// Package buildinfo says which build a binary is: its version (from the
// linker flags, else from the module's build information) and its VCS
// revision (internal/buildinfo/buildmetric exports both as the
// galactic_build_info metric).
package buildinfo

import "runtime/debug"

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
