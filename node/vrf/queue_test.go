package vrf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/identity"
)

// patience bounds every wait for a condition these tests expect to become
// true. It is generous: the machines are shared and noisy, and only a
// broken lock ever reaches it.
const patience = 30 * time.Second

// blockedWaiters counts the OFD lock requests waiting in the kernel's queue
// of the file at path, as /proc/locks shows them: lines with "->" naming
// its device and inode.
func blockedWaiters(t *testing.T, path string) int {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	file := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if strings.Contains(line, "->") && strings.Contains(line, "OFDLCK") && len(f) > 0 && hasField(f, file) {
			n++
		}
	}
	return n
}

func hasField(fields []string, want string) bool {
	for _, f := range fields {
		if f == want {
			return true
		}
	}
	return false
}

// eventually polls cond until it holds or patience runs out.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, patience)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startWaiter starts a helper process that takes the lock with Lock, writes
// name to log while holding it, and exits.
func startWaiter(t *testing.T, dir string, vpc identity.VPC, log, name string) *exec.Cmd {
	t.Helper()
	cmd := helperCommand("wait", dir, vpc, helperLogEnv+"="+log, helperNameEnv+"="+name)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd
}

// waitExit waits for a helper process to exit, failing the test if it does
// not exit, or fails, within patience.
func waitExit(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("helper process: %v", err)
		}
	case <-time.After(patience):
		_ = cmd.Process.Kill()
		t.Fatalf("helper process did not exit within %v", patience)
	}
}

// A process waiting for a lock another holds sleeps in the kernel's queue
// of the lock file, where it is woken in turn, rather than polling.
func TestAWaiterSleepsInTheKernelsQueue(t *testing.T) {
	dir := t.TempDir()
	release, err := startHolder(t, dir, 62)
	if err != nil {
		t.Fatal(err)
	}
	path := lockPath(dir, 62)
	log := filepath.Join(t.TempDir(), "order")
	waiter := startWaiter(t, dir, 62, log, "waiter")
	eventually(t, "the waiting process appears in /proc/locks as a blocked OFD lock request on the lock file", func() bool {
		return blockedWaiters(t, path) == 1
	})
	release()
	waitExit(t, waiter)
	if b, _ := os.ReadFile(log); string(b) != "waiter\n" {
		t.Fatalf("the waiter's log after the holder released = %q", b)
	}
}

// Processes waiting for a lock get it in the order they came.
func TestWaitersAreServedInTheOrderTheyCame(t *testing.T) {
	const waiters = 5
	dir := t.TempDir()
	release, err := startHolder(t, dir, 62)
	if err != nil {
		t.Fatal(err)
	}
	path := lockPath(dir, 62)
	log := filepath.Join(t.TempDir(), "order")
	var cmds []*exec.Cmd
	var want strings.Builder
	for i := range waiters {
		name := fmt.Sprintf("w%d", i)
		fmt.Fprintln(&want, name)
		cmds = append(cmds, startWaiter(t, dir, 62, log, name))
		// The next comes only once this one is queued.
		eventually(t, fmt.Sprintf("%d blocked waiters in /proc/locks", i+1), func() bool {
			return blockedWaiters(t, path) == i+1
		})
	}
	release()
	for _, cmd := range cmds {
		waitExit(t, cmd)
	}
	if b, _ := os.ReadFile(log); string(b) != want.String() {
		t.Fatalf("waiters took the lock in the order\n%s\nwant\n%s", b, want.String())
	}
}

// A deadline ends the wait at once with DeadlineExceeded. The abandoned
// kernel waiter takes its turn later and lets go: once the holder releases,
// another process gets the lock, and so does this one.
func TestADeadlineEndsTheWaitAndTheAbandonedWaiterLetsGo(t *testing.T) {
	dir := t.TempDir()
	l, _ := NewLocker(dir)
	release, err := startHolder(t, dir, 62)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		unlock, err := l.Lock(ctx, 62)
		if err == nil {
			unlock()
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock while another process holds it = %v, want DeadlineExceeded", err)
		}
	case <-time.After(patience):
		t.Fatal("Lock did not return when its deadline passed")
	}

	release()
	// Another process now gets the lock: the abandoned waiter did not keep it.
	log := filepath.Join(t.TempDir(), "order")
	waitExit(t, startWaiter(t, dir, 62, log, "other"))
	eventually(t, "the abandoned waiter gives back this process's slot", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.slots) == 0
	})
	unlock, err := l.Lock(context.Background(), 62)
	if err != nil {
		t.Fatalf("Lock after the abandoned wait: %v", err)
	}
	unlock()
}

// An older binary holding the lock with flock alone keeps a new Lock out.
func TestAnOldVersionsFlockExcludesLock(t *testing.T) {
	dir := t.TempDir()
	l, _ := NewLocker(dir)
	release, err := startHolderIn(t, "oldflock", dir, 62)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, 62); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock while an old version's process holds the flock = %v, want DeadlineExceeded", err)
	}
	release()
	ctx, cancel = context.WithTimeout(context.Background(), patience)
	defer cancel()
	unlock, err := l.Lock(ctx, 62)
	if err != nil {
		t.Fatalf("Lock after the old version's process released: %v", err)
	}
	unlock()
}

// A new Lock holder keeps out an older binary's non-blocking flock.
func TestLockExcludesAnOldVersionsFlock(t *testing.T) {
	dir := t.TempDir()
	l, _ := NewLocker(dir)
	try := func() string {
		t.Helper()
		out, err := helperCommand("oldtry", dir, 62).Output()
		if err != nil {
			t.Fatalf("old version's flock attempt: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	unlock, err := l.Lock(context.Background(), 62)
	if err != nil {
		t.Fatal(err)
	}
	if got := try(); got != "busy" {
		t.Fatalf("old version's flock attempt while Lock is held: %s, want busy", got)
	}
	unlock()
	if got := try(); got != "locked" {
		t.Fatalf("old version's flock attempt after unlock: %s, want locked", got)
	}
}
