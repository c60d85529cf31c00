// Command seccompprobe tries, inside a container, the calls a seccomp
// profile should refuse and the one the daemon needs, and prints one line
// per call: "<name> allowed" when the call reached the kernel, "<name>
// refused <errno>" when the filter stopped it. Each call is shaped so that
// the kernel answers it with something other than EPERM (a missing path, a
// missing process, a bad descriptor, or success), so EPERM is the filter's.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		return
	}
	report := func(name string, err error) {
		if errors.Is(err, unix.EPERM) {
			fmt.Printf("%s refused %v\n", name, err)
			return
		}
		fmt.Printf("%s allowed %v\n", name, err)
	}

	// A child in new user and network namespaces, as clone(2) makes it.
	cmd := exec.Command("/proc/self/exe", "child")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNET}
	report("clone_newuser", cmd.Run())

	// unshare(0) is a no-op the kernel always grants.
	runtime.LockOSThread()
	report("unshare", unix.Unshare(0))

	// The kernel looks the target up before any permission check.
	report("mount", unix.Mount("none", "/no/such/target", "tmpfs", 0, ""))

	// No such process: ESRCH from the kernel.
	_, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 0x3fffffff, 0, 0, 0, 0)
	report("ptrace", errnoErr(errno))

	// A bad descriptor: EBADF from the kernel.
	_, _, errno = unix.Syscall6(unix.SYS_VMSPLICE, ^uintptr(0), 0, 0, 0, 0, 0)
	report("vmsplice", errnoErr(errno))

	report("personality", personality(0x0040000)) // ADDR_NO_RANDOMIZE

	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_AUDIT)
	if err == nil {
		unix.Close(fd)
	}
	report("netlink_audit", err)

	fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err == nil {
		unix.Close(fd)
	}
	report("netlink_route", err)

	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err == nil {
		m.Close()
	}
	report("bpf", err)
}

func personality(p uintptr) error {
	_, _, errno := unix.Syscall(unix.SYS_PERSONALITY, p, 0, 0)
	return errnoErr(errno)
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
