package uninstall

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A /proc with no process to read is an error, never "no sandbox runs":
// the caller then keeps the tap.
func TestALookThatReadsNoProcessIsAnError(t *testing.T) {
	if _, err := (ProcScanner{Proc: t.TempDir()}).Look(context.Background()); err == nil {
		t.Fatal("an empty /proc answered; want an error")
	}
	if _, err := (ProcScanner{Proc: filepath.Join(t.TempDir(), "none")}).Look(context.Background()); err == nil {
		t.Fatal("a missing /proc answered; want an error")
	}
}

// fakeProc writes a /proc of the processes given. It is a fake of the
// kernel's /proc for the parsing above it: a real sandbox, daemon and
// plugin in another network namespace are what integration/uninstall_test.go
// runs.
func fakeProc(t *testing.T, procs map[string][3]string) string {
	t.Helper()
	proc := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(proc, pid)
		if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(p[0]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(p[1]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p[2], filepath.Join(dir, "ns", "net")); err != nil {
			t.Fatal(err)
		}
	}
	return proc
}

// A sandbox is found by a whole segment of a cgroup path, as the runtimes
// name them; a stamp that is only part of a segment is not a match. The
// daemons and plugins counted are those of this network namespace only.
func TestALookFindsSandboxesDaemonsAndPluginsOfThisNamespace(t *testing.T) {
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	proc := fakeProc(t, map[string][3]string{
		"1":    {"0::/init.scope\n", "/sbin/init\x00", own},
		"42":   {"0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-" + id + ".scope\n", "/pause\x00", own},
		"43":   {"4:pids:/kubepods/besteffort/podabc/fedcba9876\n", "/pause\x00", own},
		"50":   {"0::/system.slice/x\n", "/usr/local/bin/galactic-node\x00run\x00--interval\x00", own},
		"51":   {"0::/system.slice/y\n", "/other/galactic-node\x00run\x00", "net:[1]"},
		"52":   {"0::/system.slice/z\n", "/usr/local/bin/galactic-node\x00taps\x00", own},
		"60":   {"0::/system.slice/c\n", "/opt/cni/bin/galactic-tap\x00", own},
		"self": {"0::/ignored\n", "x\x00", own},
	})
	v, err := (ProcScanner{Proc: proc}).Look(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for owner, want := range map[string]bool{id: true, "fedcba9876": true, "fedcba": false, "lab": false, "": false, "besteffort.slice": false} {
		if got := v.SandboxRuns(owner); got != want {
			t.Errorf("SandboxRuns(%q) = %v, want %v", owner, got, want)
		}
	}
	if !slices.Equal(v.Daemons, []int{50}) {
		t.Errorf("daemons %v, want [50]: this namespace's galactic-node run only", v.Daemons)
	}
	if !slices.Equal(v.Plugins, []int{60}) {
		t.Errorf("plugins %v, want [60]", v.Plugins)
	}
}
