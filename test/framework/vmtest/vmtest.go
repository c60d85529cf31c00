// Package vmtest is a test harness, imported only by tests and never linked
// by a product binary: it runs a real QEMU against tap devices, so that a
// privileged integration test can prove the node daemon never deletes a tap
// a VMM holds, with the VMM the tap exists for rather than a stand-in.
//
// QEMU opens its taps the three ways VMMs do: by name (-netdev
// tap,ifname=...), by a descriptor inherited from its parent (fd=, see
// Options.Files), or by a descriptor sent on the QMP socket (QMP.GetFD, then
// netdev_add), as libvirt does. It runs either paused with no guest (-S),
// which holds the netdevs and starts in a second, or booted with the guest
// hack/guest.sh builds (Guest), whose /init brings up eth0 from the kernel
// command line (Options.Append) and reports on the serial console:
//
//	galactic.ip=10.10.0.3/24 galactic.gw=10.10.0.254 galactic.udp=10.10.0.254:9999
//
// gives GALACTIC-INIT, then GALACTIC-UP (eth0 up with that address),
// GALACTIC-ARP-OK or -FAIL and GALACTIC-PING-OK or -FAIL (arping and ping of
// the gateway), GALACTIC-UDP-SENT (five datagrams, "galactic-udp N", to that
// address and port) and GALACTIC-DONE, after which the guest idles, holding
// its NIC, until the test quits QEMU.
//
// QEMU always runs under TCG (-accel tcg), never KVM: the machines these
// tests run on may expose /dev/kvm as a nested PVM in which `-cpu host`
// aborts, and a test that passed only where KVM works would prove nothing
// elsewhere. TCG is slow (the guest is done about 10 s after QEMU starts on
// an idle machine, and can take 45 s under load), so every wait here is
// generous and bounded, and nothing asserts on time.
package vmtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/test/framework/syncbuf"
)

const (
	qemuBinary = "qemu-system-x86_64"
	// guestBuildTimeout bounds hack/guest.sh: it downloads a kernel package
	// (27 MB) and takes seconds on a machine with a nearby mirror.
	guestBuildTimeout = 15 * time.Minute
	// startTimeout bounds QEMU's start, until its QMP socket answers.
	startTimeout = 60 * time.Second
	// exitTimeout bounds QEMU's exit after quit or SIGKILL.
	exitTimeout = 60 * time.Second
	// kernelCmdline precedes Options.Append: the console on the serial port,
	// kernel messages off it (the guest's markers are what tests read), and
	// a panic that ends QEMU (with -no-reboot) instead of hanging the test.
	kernelCmdline = "console=ttyS0 quiet panic=-1"
)

// The guest is built once per process; hack/guest.sh caches it per machine.
var guest struct {
	once           sync.Once
	kernel, initrd string
	err            error
}

// Guest returns the kernel and initramfs paths, building them once per
// machine (hack/guest.sh) and asking once per process. It fails t when they
// cannot be built.
func Guest(t testing.TB) (kernel, initrd string) {
	t.Helper()
	requireQEMU(t)
	guest.once.Do(func() { guest.kernel, guest.initrd, guest.err = buildGuest() })
	if guest.err != nil {
		t.Fatalf("build the VM test guest: %v", guest.err)
	}
	return guest.kernel, guest.initrd
}

func buildGuest() (kernel, initrd string, err error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", "", errors.New("locate hack/guest.sh: no caller information")
	}
	script := filepath.Join(filepath.Dir(file), "..", "..", "..", "hack", "guest.sh")
	ctx, cancel := context.WithTimeout(context.Background(), guestBuildTimeout)
	defer cancel()
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("%s: %w\n%s", script, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.gz")
	for _, p := range []string{kernel, initrd} {
		if _, err := os.Stat(p); err != nil {
			return "", "", fmt.Errorf("%s printed %s: %w", script, dir, err)
		}
	}
	return kernel, initrd, nil
}

// requireQEMU skips t when QEMU is not installed, and fails it under
// CI=true, whose runner (.ci/run) installs it: a CI run that skipped the VM
// tests would pass without them.
func requireQEMU(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath(qemuBinary)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("needs %s (apt-get install qemu-system-x86): %v", qemuBinary, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Options says how Start runs QEMU.
type Options struct {
	// NetNS is the `ip netns` name (or a path to a network namespace
	// file) QEMU runs in: taps given by ifname= are looked up there. Empty:
	// the caller's.
	NetNS string
	// Netdevs each become `-netdev VALUE`, for example
	// "tap,id=n0,ifname=G00000000a001H,script=no,downscript=no,vhost=off";
	// add queues=N for a multiqueue tap.
	Netdevs []string
	// Devices each become `-device VALUE`, for example
	// "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:03".
	Devices []string
	// Files are handed to QEMU as descriptors 3, 4, ... (for a netdev's
	// fd=3). The caller may close its copies once Start returns.
	Files []*os.File
	// Boot boots the guest (Guest's kernel and initramfs). Without it QEMU
	// starts paused (-S) with no guest: enough to hold netdevs, and fast.
	Boot bool
	// Append is added to the guest's kernel command line: its network
	// configuration (galactic.ip=, galactic.gw=, galactic.udp=).
	Append string
	// Memory is the guest's RAM: 256M by default when Boot, 64M otherwise.
	Memory string
}

// VM is a running QEMU.
type VM struct {
	cmd     *exec.Cmd
	qmp     *QMP
	console string         // the serial console's file
	output  syncbuf.Buffer // QEMU's stdout and stderr
	done    chan struct{}  // closed once QEMU has exited and been reaped
	waitErr error          // cmd.Wait's, readable once done is closed
	kill    sync.Once
}

// Start runs QEMU as opts says and returns once its QMP socket answers,
// which QEMU does only after it has opened every -netdev. It fails t if
// QEMU does not start or exits before then, with QEMU's stderr. QEMU is
// killed and reaped when t ends, and if the test process dies first: QEMU
// gets SIGKILL when the thread that started it exits (PR_SET_PDEATHSIG).
func Start(t testing.TB, opts Options) *VM {
	t.Helper()
	qemu := requireQEMU(t)
	dir := socketDir(t)
	vm := &VM{console: filepath.Join(dir, "console"), done: make(chan struct{})}
	sock := filepath.Join(dir, "qmp")

	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none",
		"-machine", "pc", "-accel", "tcg",
		"-serial", "file:" + vm.console,
		"-qmp", "unix:" + sock + ",server=on,wait=off",
	}
	memory := opts.Memory
	if opts.Boot {
		kernel, initrd := Guest(t)
		args = append(args, "-kernel", kernel, "-initrd", initrd,
			"-append", strings.TrimSpace(kernelCmdline+" "+opts.Append), "-no-reboot")
		if memory == "" {
			memory = "256M"
		}
	} else {
		args = append(args, "-S")
		if memory == "" {
			memory = "64M"
		}
	}
	args = append(args, "-m", memory)
	for _, n := range opts.Netdevs {
		args = append(args, "-netdev", n)
	}
	for _, d := range opts.Devices {
		args = append(args, "-device", d)
	}

	vm.cmd = exec.Command(qemu, args...)
	vm.cmd.ExtraFiles = opts.Files
	vm.cmd.Stdout = &vm.output
	vm.cmd.Stderr = &vm.output
	vm.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := vm.run(opts.NetNS); err != nil {
		t.Fatalf("start QEMU: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("QEMU %d console:\n%s\nQEMU output:\n%s", vm.PID(), vm.Console(), vm.output.String())
		}
		vm.Kill()
	})

	q, err := vm.dial(sock)
	if err != nil {
		// QEMU may be on its way out: give it a moment, for its stderr.
		select {
		case <-vm.done:
		case <-time.After(5 * time.Second):
		}
		t.Fatalf("QEMU %s: %v\nQEMU output:\n%s", strings.Join(args, " "), err, vm.output.String())
	}
	vm.qmp = q
	return vm
}

// socketDir returns a fresh folder, removed when t ends, whose paths QEMU
// can take: short enough for a unix socket (108 bytes) and without commas,
// which QEMU's option syntax would split (t.TempDir keeps a subtest name's).
func socketDir(t testing.TB) string {
	t.Helper()
	base := os.TempDir()
	if strings.Contains(base, ",") || len(base) > 60 {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "vmtest-")
	if err != nil {
		t.Fatalf("QEMU's folder: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// run starts QEMU from a goroutine locked to its thread for QEMU's whole
// life, for two reasons: the thread enters netns, which QEMU inherits, and
// must never run other goroutines afterwards; and the kernel sends the
// parent-death signal when that thread, not the process, exits. The
// goroutine reaps QEMU and then exits still locked, so the runtime
// discards the thread.
func (vm *VM) run(netns string) error {
	var ns *os.File
	if netns != "" {
		path := netns
		if !strings.Contains(path, "/") {
			path = filepath.Join("/run/netns", netns)
		}
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("open network namespace: %w", err)
		}
		defer f.Close()
		ns = f
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		if ns != nil {
			if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
				started <- fmt.Errorf("enter network namespace %s: %w", netns, err)
				return
			}
		}
		if err := vm.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		vm.waitErr = vm.cmd.Wait()
		close(vm.done)
	}()
	return <-started
}

// dial connects to QMP once QEMU has created its socket, giving up when
// QEMU exits or startTimeout passes.
func (vm *VM) dial(sock string) (*QMP, error) {
	deadline := time.Now().Add(startTimeout)
	for {
		// QEMU creates the socket before it listens on it; refused
		// means not yet.
		q, err := dialQMP(sock)
		if err == nil || !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
			return q, err
		}
		select {
		case <-vm.done:
			return nil, fmt.Errorf("exited before its QMP socket was up: %w", vm.waitErr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no QMP socket %s after %s", sock, startTimeout)
		}
	}
}

// PID is QEMU's process ID.
func (vm *VM) PID() int { return vm.cmd.Process.Pid }

// QMP is the negotiated QMP connection.
func (vm *VM) QMP() *QMP { return vm.qmp }

// Console returns what the guest has written to its serial console (ttyS0)
// so far.
func (vm *VM) Console() string {
	b, _ := os.ReadFile(vm.console)
	return string(b)
}

// Output returns what QEMU itself has written to stdout and stderr.
func (vm *VM) Output() string { return vm.output.String() }

// Exited reports whether QEMU has exited.
func (vm *VM) Exited() bool {
	select {
	case <-vm.done:
		return true
	default:
		return false
	}
}

// WaitConsole waits up to timeout for substr on the serial console, and
// fails t with the console's text if it does not come, or if QEMU exits
// before. Call it from the test's goroutine.
func (vm *VM) WaitConsole(t testing.TB, substr string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(vm.Console(), substr) {
		select {
		case <-vm.done:
			if strings.Contains(vm.Console(), substr) {
				return
			}
			t.Fatalf("QEMU exited (%v) before %q came on the console:\n%s\nQEMU output:\n%s",
				vm.waitErr, substr, vm.Console(), vm.output.String())
		case <-deadline.C:
			t.Fatalf("no %q on the console after %s:\n%s", substr, timeout, vm.Console())
		case <-tick.C:
		}
	}
}

// Quit asks QEMU to quit (QMP quit) and waits for it to exit, killing it if
// it has not after a minute; either failure fails t.
func (vm *VM) Quit(t testing.TB) {
	t.Helper()
	// QEMU may close the socket before it answers: its exit is the answer.
	_, qerr := vm.qmp.Execute("quit", nil)
	select {
	case <-vm.done:
		if vm.waitErr != nil {
			t.Errorf("QEMU %d exited after quit: %v\nQEMU output:\n%s", vm.PID(), vm.waitErr, vm.output.String())
		}
	case <-time.After(exitTimeout):
		t.Errorf("QEMU %d still running %s after quit (QMP: %v); killing it", vm.PID(), exitTimeout, qerr)
	}
	vm.Kill()
}

// Kill sends QEMU SIGKILL and reaps it. It is idempotent, and safe once
// QEMU has exited.
func (vm *VM) Kill() {
	vm.kill.Do(func() {
		_ = vm.cmd.Process.Kill() // os.ErrProcessDone once it has exited
		select {
		case <-vm.done:
		case <-time.After(exitTimeout):
			// Stuck in the kernel; nothing more to do from here.
		}
		if vm.qmp != nil {
			_ = vm.qmp.Close()
		}
	})
}
