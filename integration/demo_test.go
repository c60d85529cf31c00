package integration

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
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

// hostState is what the demo must leave as it was: the host's galactic
// folders (the daemon's default socket, lock folder and layout record, its
// brake memory), the CNI plugins' records and the host bpffs' galactic pins.
var hostState = []string{"/run/galactic", "/var/lib/cni", "/var/lib/galactic", "/sys/fs/bpf/galactic"}

// snapshot lists every file under roots by name, mode and content (a
// symbolic link by its target); a missing root is listed as missing.
func snapshot(t *testing.T, roots []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if path == root && os.IsNotExist(err) {
					m[path] = "missing"
					return nil
				}
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			v := info.Mode().String()
			switch {
			case info.Mode().IsRegular():
				// A pinned map may refuse reads: that it does is its state.
				b, err := os.ReadFile(path)
				if err != nil {
					b = []byte(err.Error())
				}
				v += fmt.Sprintf(" %d %x", len(b), b)
			case info.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(path)
				if err != nil {
					return err
				}
				v += " -> " + target
			}
			m[path] = v
			return nil
		})
		if err != nil {
			t.Fatalf("snapshot %s: %v", root, err)
		}
	}
	return m
}

// make demo runs the daemon, as root, in a network namespace of its own:
// it must write nothing of the host's, where a daemon at its defaults
// records its pin layout, collects CNI records and keeps its brake.
func TestMakeDemoLeavesTheHostsFilesAsTheyWere(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make demo")
	}
	nettest.RequirePrivileged(t)
	nettest.RequireTCX(t)
	before := snapshot(t, hostState)
	cmd := exec.Command("make", "--no-print-directory", "-C", "..", "demo")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("make demo: %v\n%s", err, out.Bytes())
	}
	after := snapshot(t, hostState)
	for path, v := range after {
		if was, ok := before[path]; !ok {
			t.Errorf("make demo made %s (%.80s)", path, v)
		} else if was != v {
			t.Errorf("make demo changed %s: %.80s, was %.80s", path, v, was)
		}
	}
	for path := range before {
		if _, ok := after[path]; !ok {
			t.Errorf("make demo removed %s", path)
		}
	}
}
