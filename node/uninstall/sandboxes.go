package uninstall

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Processes looks at the node's processes.
type Processes interface {
	Look(ctx context.Context) (ProcessView, error)
}

// ProcessView is what one look at the node's processes found.
type ProcessView struct {
	// segments are the cgroup path segments of every process, and of
	// each systemd scope the ID after its last "-" (cri-containerd-<id>.scope,
	// crio-<id>.scope).
	segments map[string]bool
	// Daemons and Plugins are the PIDs of `galactic-node run` and of
	// galactic-tap invocations in the looker's network namespace.
	Daemons, Plugins []int
}

// SandboxRuns reports whether a process on the node is in a cgroup named
// after the sandbox: the ID CNI is given, which a tap's owner stamp
// records, is the sandbox's, whose pause process lives as long as it in a
// cgroup the runtime names after the ID (containerd's systemd driver
// cri-containerd-<id>.scope, .../<id> under cgroupfs, CRI-O's
// crio-<id>.scope while it keeps an infra container). A whole segment must
// match, so that a short stamp does not match by accident.
func (v ProcessView) SandboxRuns(owner string) bool { return owner != "" && v.segments[owner] }

// ProcScanner reads the node's /proc.
type ProcScanner struct {
	// Proc is the node's /proc (the host's, seen from a debug pod at
	// /host/proc with hostPID).
	Proc string
}

// Look reads every process's cgroup, command line and network namespace
// once. A process gone meanwhile is skipped; a /proc of which no process
// can be read is an error, so that a caller then keeps what it would judge.
func (p ProcScanner) Look(ctx context.Context) (ProcessView, error) {
	v := ProcessView{segments: map[string]bool{}}
	entries, err := os.ReadDir(p.Proc)
	if err != nil {
		return v, fmt.Errorf("list the node's processes: %w", err)
	}
	ownNet, _ := os.Readlink("/proc/self/ns/net")
	read := 0
	for _, e := range entries {
		if !isPID(e.Name()) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return v, err
		}
		dir := filepath.Join(p.Proc, e.Name())
		cg, err := os.ReadFile(filepath.Join(dir, "cgroup"))
		if err != nil {
			continue // gone meanwhile, or not ours to read
		}
		read++
		for line := range strings.Lines(string(cg)) {
			// hierarchy-ID:controllers:path
			parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
			if len(parts) != 3 {
				continue
			}
			for seg := range strings.SplitSeq(parts[2], "/") {
				if seg == "" {
					continue
				}
				v.segments[seg] = true
				// systemd names a container's unit <runtime>-<id>.scope.
				if unit, ok := strings.CutSuffix(seg, ".scope"); ok {
					if i := strings.LastIndexByte(unit, '-'); i >= 0 && i+1 < len(unit) {
						v.segments[unit[i+1:]] = true
					}
				}
			}
		}
		cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(args) == 0 || args[0] == "" {
			continue
		}
		daemon := filepath.Base(args[0]) == "galactic-node" && len(args) > 1 && args[1] == "run"
		plugin := filepath.Base(args[0]) == "galactic-tap"
		if !daemon && !plugin {
			continue
		}
		if net, err := os.Readlink(filepath.Join(dir, "ns", "net")); err != nil || net != ownNet {
			continue // another network namespace's: not this node's taps
		}
		pid, _ := strconv.Atoi(e.Name()) // isPID said digits
		if daemon {
			v.Daemons = append(v.Daemons, pid)
		} else {
			v.Plugins = append(v.Plugins, pid)
		}
	}
	if read == 0 {
		return v, fmt.Errorf("read no process's cgroup under %s: is it the node's /proc?", p.Proc)
	}
	return v, nil
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
