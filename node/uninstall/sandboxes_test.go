package uninstall

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// A /proc with no process to read is an error, never "no sandbox runs":
// the caller then keeps the tap.
func TestProcSandboxesThatReadNoProcessAreAnError(t *testing.T) {
	if _, err := (ProcSandboxes{Proc: t.TempDir()}).Running(context.Background(), "abc"); err == nil {
		t.Fatal("an empty /proc answered; want an error")
	}
	if _, err := (ProcSandboxes{Proc: filepath.Join(t.TempDir(), "none")}).Running(context.Background(), "abc"); err == nil {
		t.Fatal("a missing /proc answered; want an error")
	}
}

// The process's own cgroup names whatever it holds; an ID no cgroup names
// runs nowhere.
func TestProcSandboxesFindAnIDInACgroupPath(t *testing.T) {
	proc := t.TempDir()
	for pid, cg := range map[string]string{
		"1":    "0::/init.scope\n",
		"42":   "0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-0123abcd.scope\n",
		"self": "0::/ignored\n",
	} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := ProcSandboxes{Proc: proc}
	if ok, err := s.Running(context.Background(), "0123abcd"); err != nil || !ok {
		t.Errorf("Running(0123abcd) = %v, %v; want true", ok, err)
	}
	if ok, err := s.Running(context.Background(), "ffff"); err != nil || ok {
		t.Errorf("Running(ffff) = %v, %v; want false", ok, err)
	}
}
