package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// uninstallScene is a node galactic was installed on: taps made by the
// binary in a namespace of the test's, pins in a bpffs of its own, and
// the files install-cni and the daemon write, in a folder standing for the
// host's root.
type uninstallScene struct {
	n    *node
	root string
}

func newUninstallScene(t *testing.T) *uninstallScene {
	s := &uninstallScene{n: newNode(t), root: filepath.Join(t.TempDir(), "host")}
	for path, body := range map[string]string{
		"opt/cni/bin/galactic-tap":                            "plugin",
		"opt/cni/bin/bridge":                                  "another plugin, not galactic's",
		"opt/galactic/bin/galactic-node":                      "cli",
		"var/lib/kubelet/seccomp/galactic/galactic-node.json": "{}",
		"var/lib/kubelet/seccomp/other.json":                  "{}",
		"var/lib/cni/galactic-tap/net/gt-record":              "{}",
		"var/lib/galactic/node/brake.json":                    "{}",
		"run/galactic/datapath-layout":                        "layout",
	} {
		p := filepath.Join(s.root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// uninstall runs `galactic-node uninstall` in the node's namespace, as an
// operator on the node would, with the scene's paths; it returns the exit
// code and what the command printed.
func (s *uninstallScene) uninstall(extra ...string) (int, string) {
	s.n.t.Helper()
	args := []string{"netns", "exec", s.n.ns.Name, binary, "uninstall",
		"--admin-socket", s.n.socket, "--bpffs", s.n.bpffs, "--vrf-lock-dir", s.at("run/galactic/vrf"),
		"--cni-bin-dir", s.at("opt/cni/bin"), "--cli-dir", s.at("opt/galactic/bin"),
		"--seccomp-dir", s.at("var/lib/kubelet/seccomp/galactic"), "--layout-record", s.at("run/galactic/datapath-layout"),
		"--cni-data-dir", s.at("var/lib/cni/galactic-tap"), "--brake-memory", s.at("var/lib/galactic/node/brake.json")}
	out, err := exec.Command("ip", append(args, extra...)...).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out)
	}
	if err != nil {
		s.n.t.Fatalf("uninstall: %v: %s", err, out)
	}
	return 0, string(out)
}

func (s *uninstallScene) at(p string) string { return filepath.Join(s.root, p) }

func (s *uninstallScene) exists(p string) bool {
	_, err := os.Lstat(s.at(p))
	return err == nil
}

// sandbox stands for a pod sandbox whose pause process still runs: a
// process in a cgroup named after the sandbox ID, as the runtimes name
// them (cgroup v1's pids hierarchy here, v2's root elsewhere).
func sandbox(t *testing.T, id string) (stop func()) {
	t.Helper()
	base := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(base); err != nil {
		base = "/sys/fs/cgroup" // the unified hierarchy
	}
	// .../<id>, as cgroupfs-driven kubelets name a sandbox's cgroup.
	parent := filepath.Join(base, "galactictest-"+id[:12])
	dir := filepath.Join(parent, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("a cgroup for the sandbox: %v", err)
	}
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatalf("move the sandbox's process into its cgroup: %v", err)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for i := 0; i < 50 && os.Remove(dir) != nil; i++ {
			time.Sleep(20 * time.Millisecond)
		}
		_ = os.Remove(parent)
	}
	t.Cleanup(stop)
	return stop
}

func ifindexOf(t *testing.T, n *node, name string) uint32 {
	t.Helper()
	out, rerr := exec.Command("ip", "-n", n.ns.Name, "-o", "link", "show", name).Output()
	if rerr != nil {
		t.Fatalf("ip link show %s: %v", name, rerr)
	}
	i, _, _ := strings.Cut(string(out), ":")
	v, perr := strconv.ParseUint(strings.TrimSpace(i), 10, 32)
	if perr != nil {
		t.Fatalf("ifindex of %s in %q: %v", name, out, perr)
	}
	return uint32(v)
}

// TestUninstallTakesWhatNothingUsesAndKeepsTheRest: docs/operations.md,
// "Uninstall", through the built binary. With a daemon answering it
// changes nothing. A tap a process holds, and one whose pod sandbox still
// runs, are kept, and with them the plugin, the pins, the records and the
// CLI, while an unused tap goes with its rows; once they are gone it
// removes everything galactic put on the node and nothing else, and a run
// after that finds nothing.
func TestUninstallTakesWhatNothingUsesAndKeepsTheRest(t *testing.T) {
	nettest.RequirePrivileged(t)
	s := newUninstallScene(t)
	runningOwner := fmt.Sprintf("%064x", time.Now().UnixNano())
	s.n.tapAdd("1", "sandbox-gone-"+runningOwner[:12])
	s.n.tapAdd("2", runningOwner)
	s.n.tapAdd("3", "vm-"+runningOwner[:12])
	unused, ofSandbox, held := tapName("1"), tapName("2"), tapName("3")
	unusedIndex := ifindexOf(t, s.n, unused)
	stopSandbox := sandbox(t, runningOwner)
	holder := nettest.Hold(t, s.n.ns, held, nettest.HoldOptions{})
	pinDir := filepath.Join(s.n.bpffs, datapath.PinSubdir)

	// A folder to remove whole that is not galactic's, or paths that hold
	// none of its state on a node with its taps (a wrong host root):
	// nothing changes.
	if code, out := s.uninstall("--vrf-lock-dir", t.TempDir()); code != 2 || !strings.Contains(out, "not galactic's") {
		t.Fatalf("with a lock folder not named for galactic: exit %d, %s; want 2, refused", code, out)
	}
	elsewhere := filepath.Join(t.TempDir(), "galactic-elsewhere")
	if code, out := s.uninstall("--host-root", elsewhere); code != 3 || !strings.Contains(out, "is the host root right?") {
		t.Fatalf("under a root with none of the state: exit %d, %s; want 3, refused", code, out)
	}

	// A daemon answers: nothing changes.
	_, log := s.n.start("--inventory-file", s.n.writeInventory(liveAttachment), "--dry-run")
	s.n.waitReady(log)
	if code, out := s.uninstall(); code != 3 || !strings.Contains(out, "daemon still runs") {
		t.Fatalf("with the daemon running: exit %d, %s; want 3, refused", code, out)
	}
	for _, name := range []string{unused, ofSandbox, held} {
		if _, gone := s.n.linkGone(name); gone {
			t.Fatalf("%s went while the daemon ran", name)
		}
	}
	for _, d := range s.n.daemons {
		_ = d.Process.Kill()
		_ = d.Wait()
	}

	// A dry run says what it would do, and does nothing.
	code, out := s.uninstall("--dry-run")
	if code != 4 || !strings.Contains(out, "would remove tap "+unused) {
		t.Fatalf("dry run: exit %d, %s; want 4, naming %s as what it would remove", code, out, unused)
	}
	if _, gone := s.n.linkGone(unused); gone {
		t.Fatal("a dry run removed a tap")
	}

	code, out = s.uninstall()
	if code != 4 {
		t.Fatalf("with a held tap and a running sandbox: exit %d, %s; want 4", code, out)
	}
	for _, want := range []string{"removed tap " + unused, "kept tap " + ofSandbox, "still has processes", "kept tap " + held, "run again once they are gone"} {
		if !strings.Contains(out, want) {
			t.Errorf("the first uninstall does not say %q:\n%s", want, out)
		}
	}
	if _, gone := s.n.linkGone(unused); !gone {
		t.Errorf("%s, used by nothing, is still there", unused)
	}
	if rows := nettest.PinnedRowsKeyedBy(t, pinDir, unusedIndex, counterMaps); len(rows) > 0 {
		t.Errorf("%s went, but its rows stay: %v", unused, rows)
	}
	for _, name := range []string{ofSandbox, held} {
		if _, gone := s.n.linkGone(name); gone {
			t.Errorf("%s, in use, was removed", name)
		}
	}
	for _, p := range []string{"opt/cni/bin/galactic-tap", "opt/galactic/bin/galactic-node", "var/lib/cni/galactic-tap/net/gt-record", "run/galactic/datapath-layout"} {
		if !s.exists(p) {
			t.Errorf("/%s went while taps in use are kept: it serves them", p)
		}
	}
	if _, err := os.Stat(pinDir); err != nil {
		t.Errorf("the pins went while taps in use are kept: %v", err)
	}

	// The VM and the pod are gone.
	holder.Release()
	stopSandbox()
	code, out = s.uninstall()
	if code != 0 {
		t.Fatalf("with nothing in use: exit %d, %s; want 0", code, out)
	}
	for _, name := range []string{ofSandbox, held} {
		if _, gone := s.n.linkGone(name); !gone {
			t.Errorf("%s is still there once unused", name)
		}
	}
	for _, p := range []string{"opt/cni/bin/galactic-tap", "opt/cni/bin/.galactic-tap.tmp-789", "opt/galactic", "var/lib/kubelet/seccomp/galactic", "var/lib/cni/galactic-tap", "var/lib/galactic", "run/galactic"} {
		if s.exists(p) {
			t.Errorf("/%s is still there", p)
		}
	}
	for _, p := range []string{"opt/cni/bin/bridge", "var/lib/kubelet/seccomp/other.json"} {
		if !s.exists(p) {
			t.Errorf("/%s, not galactic's, was removed", p)
		}
	}
	if _, err := os.Stat(pinDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pins are still there: %v", err)
	}

	code, out = s.uninstall()
	if code != 0 || !strings.Contains(out, "nothing of galactic's is left") {
		t.Errorf("a second run: exit %d, %s; want 0, finding nothing", code, out)
	}
	if _, err := os.Stat(s.at("run/galactic")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a run with nothing to do made the lock folder: %v", err)
	}
}
