package holder

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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
// procfs of the initial PID namespace, mounted without a hidepid that hides
// from this scanner, the scanner holds
// the capabilities that open every process's descriptors, and every one
// could be read: a process or descriptor that goes away meanwhile (ENOENT,
// ESRCH) is fine; any other error is not.
func (p Proc) Scan(ctx context.Context) Scan {
	s := Scan{byTap: map[string][]Holder{}}
	var incomplete string
	for _, check := range []func() error{p.inInitPIDNamespace, p.hidesProcesses, missingCapabilities} {
		if err := check(); err != nil && incomplete == "" {
			incomplete = err.Error()
		}
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
			incomplete = fmt.Sprintf("pid %d (%s): %v", pid, p.command(e.Name()), err)
		}
		for _, name := range taps {
			s.byTap[name] = append(s.byTap[name], Holder{PID: pid, Command: p.command(e.Name())})
		}
	}
	s.complete, s.why = incomplete == "", incomplete
	return s
}

// Capabilities a scanner needs to read every process's descriptors
// (docs/kernel.md): CAP_DAC_READ_SEARCH (or CAP_DAC_OVERRIDE) opens another
// user's mode-0500 fd and fdinfo folders (fs/proc/fd.c,
// proc_fd_permission), and CAP_SYS_PTRACE passes the ptrace access check
// that following a descriptor and reading its fdinfo make, for another
// user's process or one with capabilities the scanner lacks
// (proc_fd_access_allowed, __ptrace_may_access).
func missingCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read own capabilities: %w", err)
	}
	has := func(c int) bool { return data[c/32].Effective&(1<<(uint(c)%32)) != 0 }
	var missing []string
	if !has(unix.CAP_SYS_PTRACE) {
		missing = append(missing, "CAP_SYS_PTRACE")
	}
	if !has(unix.CAP_DAC_READ_SEARCH) && !has(unix.CAP_DAC_OVERRIDE) {
		missing = append(missing, "CAP_DAC_READ_SEARCH")
	}
	if len(missing) > 0 {
		return fmt.Errorf("without %s other users' and more privileged processes' descriptors cannot be read", strings.Join(missing, " and "))
	}
	return nil
}

// hidesProcesses reports a procfs at Root mounted with hidepid, which
// leaves processes out of the listing with no error (fs/proc/base.c,
// has_pid_permissions): with hidepid=4 (ptraceable) every process the
// scanner may not ptrace, and with hidepid=1 or 2 those of other users
// unless the scanner is in the mount's gid= group (root's group by
// default). A capability does not help: an LSM may still refuse the ptrace
// check, and the process then vanishes (measured: docs/kernel.md).
func (p Proc) hidesProcesses() error {
	opts, err := mountOptions(filepath.Join(p.Root, "self", "mountinfo"), p.Root)
	if err != nil {
		return err
	}
	hide, ok := opts["hidepid"]
	switch {
	case !ok || hide == "0" || hide == "off":
		return nil
	case hide != "4" && hide != "ptraceable" && inGroup(opts["gid"]):
		return nil
	}
	return fmt.Errorf("%s is mounted with hidepid=%s: processes are hidden without an error", p.Root, hide)
}

// inGroup reports whether this process is in the group gid names; an
// absent gid= is root's group.
func inGroup(gid string) bool {
	if gid == "" {
		gid = "0"
	}
	g, err := strconv.Atoi(gid)
	if err != nil {
		return false
	}
	if os.Getegid() == g {
		return true
	}
	groups, _ := os.Getgroups()
	return slices.Contains(groups, g)
}

// mountOptions returns the superblock options of the mount at mountPoint,
// as mountinfo lists them after the filesystem type and source.
func mountOptions(mountinfo, mountPoint string) (map[string]string, error) {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("read mount options of %s: %w", mountPoint, err)
	}
	var found map[string]string
	for line := range strings.Lines(string(b)) {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(strings.TrimSpace(line), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 || fields[4] != filepath.Clean(mountPoint) {
			continue
		}
		found = map[string]string{} // the last mount on a path is the one seen
		for _, o := range strings.Split(tail[2], ",") {
			k, v, _ := strings.Cut(o, "=")
			found[k] = v
		}
	}
	if found == nil {
		return nil, fmt.Errorf("read mount options of %s: not a mount point", mountPoint)
	}
	return found, nil
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
		return nil, gone(err, "read threads")
	}
	seen := map[string]bool{}
	var taps []string
	for _, task := range tasks {
		dir := filepath.Join(p.Root, pid, "task", task.Name())
		fds, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			if err := gone(err, "read descriptors"); err != nil {
				return taps, err
			}
			continue
		}
		for _, fd := range fds {
			var st unix.Stat_t
			err := unix.Stat(filepath.Join(dir, "fd", fd.Name()), &st)
			switch {
			case err == nil && (st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != tunDevice):
				continue
			case err != nil && gone(err, "") == nil:
				continue
			}
			// A tun, or a descriptor that could not be followed
			// (EACCES: another user's, a process with capabilities
			// the scanner lacks, or a target whose filesystem refuses
			// the stat): its fdinfo names the tap, if it is one, and
			// an fdinfo that cannot be read leaves the scan incomplete.
			name, err := tapOfFD(filepath.Join(dir, "fdinfo", fd.Name()))
			if err != nil {
				if err := gone(err, "read descriptor "+fd.Name()); err != nil {
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
