package uninstall

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ProcSandboxes finds a pod sandbox by its ID in the cgroup paths of the
// node's processes. The ID CNI is given, which a tap's owner stamp records,
// is the sandbox's; its pause process lives as long as the sandbox, in a
// cgroup the runtime names after the ID (containerd's systemd driver
// cri-containerd-<id>.scope, CRI-O's crio-<id>.scope, .../<id> under
// cgroupfs). A process gone between the listing and the read is skipped; a
// /proc that cannot be listed is an error, so that a tap is then kept.
type ProcSandboxes struct {
	// Proc is the node's /proc (the host's, seen from a debug pod at
	// /host/proc with hostPID).
	Proc string
}

// Running reports whether any process's cgroup names owner.
func (p ProcSandboxes) Running(ctx context.Context, owner string) (bool, error) {
	if owner == "" {
		return false, errors.New("no owner to look for")
	}
	entries, err := os.ReadDir(p.Proc)
	if err != nil {
		return false, fmt.Errorf("list the node's processes: %w", err)
	}
	seen := 0
	for _, e := range entries {
		if !isPID(e.Name()) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
		b, err := os.ReadFile(filepath.Join(p.Proc, e.Name(), "cgroup"))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			continue
		}
		if err != nil {
			continue // gone meanwhile (ESRCH)
		}
		seen++
		if strings.Contains(string(b), owner) {
			return true, nil
		}
	}
	if seen == 0 {
		return false, fmt.Errorf("read no process's cgroup under %s: is it the node's /proc?", p.Proc)
	}
	return false, nil
}

func isPID(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
