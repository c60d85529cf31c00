package robustness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

// bins are the binaries under test: built here from this tree, or taken
// from GALACTICTEST_ROBUSTNESS_BINDIR (its galactic-node and galactic-tap),
// which is how a run is pointed at another checkout's build, one without a
// fix, say (docs/robustness.md).
var bins struct {
	daemon, plugin string
	hooked         string // the daemon with -tags galactic_testhooks
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "galactic-robustness-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.daemon = filepath.Join(dir, "galactic-node")
	bins.plugin = filepath.Join(dir, "galactic-tap")
	bins.hooked = filepath.Join(dir, "galactic-node-testhooks")
	for _, b := range []struct {
		out  string
		args []string
	}{
		{bins.daemon, []string{"../../cmd/galactic-node"}},
		{bins.plugin, []string{"-ldflags=-s -w", "../../cmd/galactic-tap"}},
		{bins.hooked, []string{"-tags", "galactic_testhooks", "../../cmd/galactic-node"}},
	} {
		// Static and without build paths, as `make images` builds them,
		// so that the packages come out of the cache it filled.
		cmd := exec.Command("go", append([]string{"build", "-trimpath", "-o", b.out}, b.args...)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.out, err, out)
			os.Exit(1)
		}
	}
	if other := os.Getenv("GALACTICTEST_ROBUSTNESS_BINDIR"); other != "" {
		bins.daemon = filepath.Join(other, "galactic-node")
		bins.plugin = filepath.Join(other, "galactic-tap")
	}
	code := clustertest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}
