package agent

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Holder is a process holding a tap's queue open.
type Holder struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
}

// FindHolders scans procRoot for file descriptors attached to taps: an fd
// of /dev/net/tun whose fdinfo has an "iff:" line naming the device. It
// returns holders by tap name. Processes it cannot read are skipped: it is a
// diagnostic view, never an input to a removal decision (the kernel's queue
// counts are).
func FindHolders(procRoot string) map[string][]Holder {
	out := map[string][]Holder{}
	procs, err := os.ReadDir(procRoot)
	if err != nil {
		return out
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join(procRoot, p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil || target != "/dev/net/tun" {
				continue
			}
			name := tapOfFD(filepath.Join(procRoot, p.Name(), "fdinfo", fd.Name()))
			if name == "" || seen[name] {
				continue
			}
			seen[name] = true
			out[name] = append(out[name], Holder{PID: pid, Command: command(procRoot, p.Name())})
		}
	}
	return out
}

func tapOfFD(fdinfo string) string {
	f, err := os.Open(fdinfo)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if name, ok := strings.CutPrefix(s.Text(), "iff:"); ok {
			return strings.TrimSpace(name)
		}
	}
	return ""
}

func command(procRoot, pid string) string {
	b, err := os.ReadFile(filepath.Join(procRoot, pid, "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
