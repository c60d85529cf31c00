//go:build linux

package nettest

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/tun"
)

type releaser interface{ Release() }

var holders = []struct {
	name string
	hold func(t testing.TB, ns *NS, name string, mode tun.Mode) releaser
	// whether the holder keeps the tap's file in its descriptor table
	inFDTable bool
}{
	{"in flight", func(t testing.TB, ns *NS, name string, mode tun.Mode) releaser {
		return HoldInFlight(t, ns, name, mode)
	}, false},
	{"io_uring fixed file", func(t testing.TB, ns *NS, name string, mode tun.Mode) releaser {
		return HoldIOUringFixed(t, ns, name, mode)
	}, false},
	{"in a PID namespace", func(t testing.TB, ns *NS, name string, mode tun.Mode) releaser {
		return HoldInPIDNamespace(t, ns, name, mode)
	}, true},
	{"as another user", func(t testing.TB, ns *NS, name string, mode tun.Mode) releaser {
		return HoldAs(t, ns, name, mode, Nobody)
	}, true},
}

// TestHoldersHoldATap proves each holder holds for real: the kernel refuses
// a second single-queue attach with EBUSY and counts a multiqueue queue,
// while the test process keeps no copy of the file; after Release the tap
// is free at once.
func TestHoldersHoldATap(t *testing.T) {
	RequirePrivileged(t)
	for _, hc := range holders {
		t.Run(hc.name+"/single-queue", func(t *testing.T) {
			ns := NewNS(t)
			name := tapName()
			mode := tun.Mode{SingleQueue: true}
			NewTap(t, ns, name, mode)
			h := hc.hold(t, ns, name, mode)
			checkFDTables(t, name, hc.inFDTable)

			if f, err := tun.Open(ns.File, name, mode); !errors.Is(err, unix.EBUSY) {
				if err == nil {
					f.Close()
				}
				t.Fatalf("second attach while held: %v, want EBUSY", err)
			}
			h.Release()
			f, err := tun.Open(ns.File, name, mode)
			if err != nil {
				t.Fatalf("attach after Release: %v", err)
			}
			f.Close()
			h.Release() // idempotent
		})
		t.Run(hc.name+"/multiqueue", func(t *testing.T) {
			ns := NewNS(t)
			name := tapName()
			NewTap(t, ns, name, tun.Mode{})
			h := hc.hold(t, ns, name, tun.Mode{})
			checkFDTables(t, name, hc.inFDTable)
			if out := ns.IP(t, "-d", "link", "show", name); !strings.Contains(out, "numqueues 1 ") {
				t.Fatalf("held multiqueue tap, want numqueues 1:\n%s", out)
			}
			h.Release()
			if out := ns.IP(t, "-d", "link", "show", name); !strings.Contains(out, "numqueues 0 ") {
				t.Fatalf("released multiqueue tap, want numqueues 0:\n%s", out)
			}
		})
	}
}

func TestHolderInPIDNamespaceIsPID1There(t *testing.T) {
	ns := NewNS(t)
	name := tapName()
	h := HoldInPIDNamespace(t, ns, name, tun.Mode{})
	nspid := statusField(t, h.PID(), "NSpid")
	if f := strings.Fields(nspid); len(f) != 2 || f[1] != "1" {
		t.Errorf("NSpid of holder = %q, want its host pid then 1", nspid)
	}
	self, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Fatal(err)
	}
	if other, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(h.PID()), "ns", "pid")); err != nil || other == self {
		t.Errorf("holder's PID namespace %q (%v), want other than the test's %q", other, err, self)
	}
}

func TestHolderAsAnotherUser(t *testing.T) {
	ns := NewNS(t)
	h := HoldAs(t, ns, tapName(), tun.Mode{}, Nobody)
	wantIDs(t, h.PID())
}

func TestOtherUserProcess(t *testing.T) {
	RequirePrivileged(t)
	pid := OtherUserProcess(t)
	wantIDs(t, pid)
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if tapOf(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()), filepath.Join("/proc", strconv.Itoa(pid), "fdinfo", fd.Name())) != "" {
			t.Errorf("process of another user holds a tap at fd %s", fd.Name())
		}
	}
}

// wantIDs checks that pid runs with every uid and gid Nobody and no
// capabilities.
func wantIDs(t *testing.T, pid int) {
	t.Helper()
	for _, field := range []string{"Uid", "Gid"} {
		if got, want := strings.Fields(statusField(t, pid, field)), Nobody; len(got) != 4 || got[0] != strconv.Itoa(want) || got[1] != strconv.Itoa(want) || got[2] != strconv.Itoa(want) || got[3] != strconv.Itoa(want) {
			t.Errorf("%s of %d = %v, want %d everywhere", field, pid, got, want)
		}
	}
	if got := statusField(t, pid, "CapEff"); strings.Trim(got, "0") != "" {
		t.Errorf("CapEff of %d = %s, want none", pid, got)
	}
}

// checkFDTables fails t if the test process holds the tap called name, or
// if whether any process's descriptor table holds it is not want.
func checkFDTables(t *testing.T, name string, want bool) {
	t.Helper()
	pids := fdTablesHolding(t, name)
	self := strconv.Itoa(os.Getpid())
	for _, pid := range pids {
		if pid == self {
			t.Fatalf("the test process still holds %s", name)
		}
	}
	if got := len(pids) > 0; got != want {
		t.Fatalf("%s in a descriptor table: %v (pids %v), want %v", name, got, pids, want)
	}
}

// fdTablesHolding scans every thread's descriptors for a tun file attached
// to the tap called name.
func fdTablesHolding(t *testing.T, name string) []string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/[0-9]*/task/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var pids []string
	for _, task := range tasks {
		pid := strings.Split(task, "/")[2]
		fds, err := os.ReadDir(filepath.Join(task, "fd"))
		if err != nil {
			continue // gone meanwhile
		}
		for _, fd := range fds {
			if tapOf(filepath.Join(task, "fd", fd.Name()), filepath.Join(task, "fdinfo", fd.Name())) == name && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// tapOf returns the tap the descriptor at link is attached to ("" if it is
// no tun file), from the `iff:` line of its fdinfo.
func tapOf(link, fdinfo string) string {
	var st unix.Stat_t
	if err := unix.Stat(link, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(10, 200) {
		return ""
	}
	f, err := os.Open(fdinfo)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "iff:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func statusField(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

// tapName is a tap name unique across concurrently running test packages,
// so that a scan of every process finds only this test's holders.
func tapName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "hold" + hex.EncodeToString(b[:])
}
