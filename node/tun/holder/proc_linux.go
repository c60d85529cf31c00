package holder

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// initPIDNamespaceInode is PROC_PID_INIT_INO: the inode of
// /proc/self/ns/pid in the initial PID namespace, and only there.
const initPIDNamespaceInode = 0xEFFFFFFC

// tunDevice is /dev/net/tun's device number (misc 10, minor 200), matched
// instead of a path: a VMM may open its own node of the device.
var tunDevice = unix.Mkdev(10, 200)

// Scan reads every process. The scan is complete only when Root is the
// procfs of the initial PID namespace and every process's descriptors could
// be read; a process that exits meanwhile is fine, one that refuses is not.
func (p Proc) Scan(ctx context.Context) Scan {
	s := Scan{byTap: map[string][]Holder{}}
	var incomplete string
	if err := p.inInitPIDNamespace(); err != nil {
		incomplete = err.Error()
	}
	procs, err := os.ReadDir(p.Root)
	if err != nil {
		s.why = fmt.Sprintf("read %s: %v", p.Root, err)
		return s
	}
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			s.why = fmt.Sprintf("scan cancelled: %v", err)
			return s
		}
		taps, err := p.process(e.Name())
		if err != nil && incomplete == "" {
			incomplete = err.Error()
		}
		for _, name := range taps {
			s.byTap[name] = append(s.byTap[name], Holder{PID: pid, Command: p.command(e.Name())})
		}
	}
	s.complete, s.why = incomplete == "", incomplete
	return s
}

func (p Proc) inInitPIDNamespace() error {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(p.Root, "self", "ns", "pid"), &st); err != nil {
		return fmt.Errorf("read PID namespace: %w", err)
	}
	if st.Ino != initPIDNamespaceInode {
		return errors.New("not in the initial PID namespace: processes of other namespaces are invisible (run with hostPID)")
	}
	return nil
}

// process returns the taps that pid's threads hold, each once.
func (p Proc) process(pid string) ([]string, error) {
	tasks, err := os.ReadDir(filepath.Join(p.Root, pid, "task"))
	if err != nil {
		return nil, gone(err, "read threads of pid "+pid)
	}
	seen := map[string]bool{}
	var taps []string
	for _, task := range tasks {
		dir := filepath.Join(p.Root, pid, "task", task.Name())
		fds, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			if err := gone(err, "read descriptors of pid "+pid); err != nil {
				return taps, err
			}
			continue
		}
		for _, fd := range fds {
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(dir, "fd", fd.Name()), &st); err != nil {
				continue // closed meanwhile, or a dangling special file: not a tun
			}
			if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != tunDevice {
				continue
			}
			name, err := tapOfFD(filepath.Join(dir, "fdinfo", fd.Name()))
			if err != nil {
				if err := gone(err, "read fdinfo of pid "+pid); err != nil {
					return taps, err
				}
				continue
			}
			if name != "" && !seen[name] {
				seen[name] = true
				taps = append(taps, name)
			}
		}
	}
	return taps, nil
}

// gone turns "the process or descriptor went away" into nil and any other
// failure into an error: only the latter leaves the scan incomplete.
func gone(err error, what string) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

func tapOfFD(fdinfo string) (string, error) {
	f, err := os.Open(fdinfo)
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if name, ok := strings.CutPrefix(s.Text(), "iff:"); ok {
			return strings.TrimSpace(name), nil
		}
	}
	return "", s.Err()
}

func (p Proc) command(pid string) string {
	b, err := os.ReadFile(filepath.Join(p.Root, pid, "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
