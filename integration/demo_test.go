package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/internal/nettest"
)

// TestTheDemoRunsAndLeavesNothingBehind runs make demo's script with the
// built binary: every step it checks must hold, it must show what it made
// and the CLI it ends with, and afterwards no namespace, mount, process or
// folder of it may remain.
func TestTheDemoRunsAndLeavesNothingBehind(t *testing.T) {
	nettest.RequirePrivileged(t)
	nettest.RequireTCX(t) // the demo adds taps as CNI ADD does
	before, _ := filepath.Glob("/tmp/galactic-demo.*")
	// The script takes its binary from GALACTICTEST_NODE_BIN: a harness
	// variable, outside the GALACTIC_* space the binaries own.
	cmd := exec.Command("../hack/demo.sh")
	cmd.Env = append(os.Environ(), "GALACTICTEST_NODE_BIN="+binary)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "everything it made is removed") {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	// It says what it made, by the names the kernel shows, and ends with
	// the client subcommands beside the curl they replace, run for real.
	for _, want := range []string{"  G00000000aV ", "  G00000000a003H ", `VPC "a" is 10`,
		"$ curl --unix-socket", "$ galactic-node taps --socket", "$ galactic-node status --socket", "$ galactic-node pass --dry-run --socket", "completed  true"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out)
		}
	}
	if ns := nettest.Run(t, "ip", "netns", "list"); strings.Contains(ns, "galactic-demo-") {
		t.Errorf("a demo namespace is left: %s", ns)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), "galactic-demo.") {
		t.Error("a demo mount is left")
	}
	if pids, _ := exec.Command("pgrep", "-f", binary).Output(); len(pids) > 0 {
		t.Errorf("demo processes are left: %s", pids)
	}
	if after, _ := filepath.Glob("/tmp/galactic-demo.*"); len(after) > len(before) {
		t.Errorf("demo folders are left: %v", after)
	}
}
