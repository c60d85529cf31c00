package vrf

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/identity"
)

const (
	helperEnv     = "GALACTICTEST_VRF_LOCK_HELPER_DIR"
	helperVPCEnv  = "GALACTICTEST_VRF_LOCK_HELPER_VPC"
	helperModeEnv = "GALACTICTEST_VRF_LOCK_HELPER_MODE"
	helperLogEnv  = "GALACTICTEST_VRF_LOCK_HELPER_LOG"
	helperNameEnv = "GALACTICTEST_VRF_LOCK_HELPER_NAME"
)

// TestMain lets the test binary act as a second process: by default one
// that holds a lock until its stdin closes; see helper for the others.
func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		os.Exit(helper(os.Getenv(helperModeEnv), dir))
	}
	os.Exit(m.Run())
}

// helper runs the second process's part: hold (the default) takes the lock
// with Lock and holds it until stdin closes; oldflock holds it as versions
// before the OFD lock did, with flock alone, until stdin closes; oldtry makes
// one non-blocking flock attempt as those versions did and says "locked" or
// "busy"; wait takes the lock with Lock, appends its name to the log file,
// and releases it at once.
func helper(mode, dir string) int {
	switch mode {
	case "", "wait":
		return lockWithLocker(mode, dir)
	case "oldflock", "oldtry":
		vpc, _ := strconv.ParseUint(os.Getenv(helperVPCEnv), 10, 64)
		f, err := os.OpenFile(lockPath(dir, identity.VPC(vpc)), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return 2
		}
		defer f.Close()
		if mode == "oldtry" {
			if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
				_, _ = os.Stdout.WriteString("busy\n")
			} else if err == nil {
				_, _ = os.Stdout.WriteString("locked\n")
			} else {
				return 3
			}
			return 0
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			return 3
		}
		_, _ = os.Stdout.WriteString("locked\n")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		return 0
	}
	return 1
}

func lockPath(dir string, vpc identity.VPC) string {
	return filepath.Join(dir, vpc.VRFName()+".lock")
}

// helperCommand is the test binary run as a helper process in mode.
func helperCommand(mode, dir string, vpc identity.VPC, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir, helperVPCEnv+"="+strconv.FormatUint(uint64(vpc), 10), helperModeEnv+"="+mode)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// lockWithLocker takes the lock with Lock, then holds it until stdin
// closes (hold, mode "") or appends its name to the log file and releases
// it at once (wait).
func lockWithLocker(mode, dir string) int {
	vpc, _ := strconv.ParseUint(os.Getenv(helperVPCEnv), 10, 64)
	l, err := NewLocker(dir)
	if err != nil {
		return 2
	}
	unlock, err := l.Lock(context.Background(), identity.VPC(vpc))
	if err != nil {
		return 3
	}
	defer unlock()
	if mode == "" {
		_, _ = os.Stdout.WriteString("locked\n")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		return 0
	}
	log, err := os.OpenFile(os.Getenv(helperLogEnv), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return 4
	}
	defer log.Close()
	if _, err := log.WriteString(os.Getenv(helperNameEnv) + "\n"); err != nil {
		return 5
	}
	return 0
}

// startHolder starts another process holding vpc's lock in dir and returns
// the function that makes it release the lock and exit. It returns once the
// other process holds the lock.
func startHolder(t *testing.T, dir string, vpc identity.VPC) (release func(), err error) {
	return startHolderIn(t, "", dir, vpc)
}

// startHolderIn is startHolder with the helper's mode: "" or "oldflock".
func startHolderIn(t *testing.T, mode, dir string, vpc identity.VPC) (release func(), err error) {
	cmd := helperCommand(mode, dir, vpc)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("holder process did not lock: %q: %w", line, err)
	}
	var done atomic.Bool
	release = func() {
		if done.Swap(true) {
			return
		}
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("holder process: %v", err)
		}
	}
	t.Cleanup(release)
	return release, nil
}

func TestALockHeldByAnotherProcessExcludesThisOne(t *testing.T) {
	dir := t.TempDir()
	l, err := NewLocker(dir)
	if err != nil {
		t.Fatal(err)
	}
	release, err := startHolder(t, dir, 62)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, 62); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock while another process holds it = %v, want DeadlineExceeded", err)
	}
	// A different VRF is not blocked by the other process.
	unlockOther, err := l.Lock(context.Background(), 63)
	if err != nil {
		t.Fatalf("Lock of another VRF: %v", err)
	}
	unlockOther()

	release()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlock, err := l.Lock(ctx, 62)
	if err != nil {
		t.Fatalf("Lock after the other process released: %v", err)
	}
	unlock()
}

func TestThisProcessExcludesAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	l, _ := NewLocker(dir)
	unlock, err := l.Lock(context.Background(), 62)
	if err != nil {
		t.Fatal(err)
	}
	locked := make(chan struct{})
	go func() {
		if _, err := startHolder(t, dir, 62); err != nil {
			t.Error(err)
		}
		close(locked)
	}()
	select {
	case <-locked:
		t.Fatal("another process took a lock this process holds")
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	select {
	case <-locked:
	case <-time.After(10 * time.Second):
		t.Fatal("the other process never took the lock after it was released")
	}
}

func TestALockExcludesASecondGoroutine(t *testing.T) {
	l, _ := NewLocker(t.TempDir())
	unlock, err := l.Lock(context.Background(), 62)
	if err != nil {
		t.Fatal(err)
	}
	var inside atomic.Int32
	inside.Store(1)
	got := make(chan int32)
	go func() {
		unlock2, err := l.Lock(context.Background(), 62)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- inside.Load()
		unlock2()
	}()
	select {
	case v := <-got:
		t.Fatalf("second goroutine locked while the first held the lock (inside=%d)", v)
	case <-time.After(100 * time.Millisecond):
	}
	inside.Store(0)
	unlock()
	if v := <-got; v != 0 {
		t.Fatalf("second goroutine saw inside=%d", v)
	}
}

func TestTwoVRFsNeverBlockEachOther(t *testing.T) {
	l, _ := NewLocker(t.TempDir())
	unlockA, err := l.Lock(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer unlockA()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlockB, err := l.Lock(ctx, 2)
	if err != nil {
		t.Fatalf("Lock of VRF 2 while VRF 1 is held: %v", err)
	}
	unlockB()
}

func TestACancelledWaitReturnsPromptly(t *testing.T) {
	l, _ := NewLocker(t.TempDir())
	unlock, _ := l.Lock(context.Background(), 62)
	defer unlock()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := l.Lock(ctx, 62)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lock did not return after its context was cancelled")
	}
	// The abandoned wait left nothing behind: the lock still works.
	unlock()
	unlock2, err := l.Lock(context.Background(), 62)
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
	if n := len(l.slots); n != 0 {
		t.Fatalf("%d slots left after every lock was released", n)
	}
}

func TestLockFilesAreNeverUnlinked(t *testing.T) {
	dir := t.TempDir()
	l, _ := NewLocker(dir)
	unlock, _ := l.Lock(context.Background(), 62)
	unlock()
	if _, err := os.Stat(dir + "/" + identity.VPC(62).VRFName() + ".lock"); err != nil {
		t.Fatalf("lock file after release: %v", err)
	}
}

func TestBadInputIsRefused(t *testing.T) {
	if _, err := NewLocker(""); err == nil {
		t.Fatal("NewLocker(\"\") succeeded")
	}
	l, _ := NewLocker(t.TempDir())
	for _, vpc := range []identity.VPC{0, identity.MaxVPC + 1} {
		if _, err := l.Lock(context.Background(), vpc); !errors.Is(err, identity.ErrMalformed) {
			t.Fatalf("Lock(%d) = %v, want ErrMalformed", vpc, err)
		}
	}
}
