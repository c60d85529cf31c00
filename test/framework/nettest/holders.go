//go:build linux

package nettest

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/tun"
)

// The holders below hold a tap where a scan of /proc/PID/fd cannot see it,
// or as a process a scanner may not read: the kernel still refuses a
// second TUNSETIFF of a held single-queue tap with EBUSY and still counts
// the queue of a multiqueue one, which is what a daemon must go by.
// docs/holders-measured.md records what a scanner sees of each.

// Nobody is the uid and gid of nobody/nogroup, the "other user" of tests.
const Nobody = 65534

// io_uring_register(2) opcodes (include/uapi/linux/io_uring.h).
const (
	ioringRegisterFiles   = 2
	ioringUnregisterFiles = 3
)

// HoldInFlight attaches a queue to the tap called name and sends its file
// descriptor with SCM_RIGHTS over a unix socketpair, never receiving it.
// The test closes its descriptor and the sending end; a child process keeps
// the receiving end. The tap's file then lives only in that socket's
// receive queue: in no process's descriptor table. Release kills the child,
// whose exit purges the queue and closes the file.
func HoldInFlight(t testing.TB, ns *NS, name string, mode tun.Mode) *Holder {
	t.Helper()
	f := openTap(t, ns, name, mode)
	defer f.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair for %s: %v", name, err)
	}
	send, recv := os.NewFile(uintptr(fds[0]), "scm-send"), os.NewFile(uintptr(fds[1]), "scm-recv")
	defer send.Close()
	defer recv.Close()
	if err := unix.Sendmsg(int(send.Fd()), []byte{0}, unix.UnixRights(int(f.Fd())), nil, 0); err != nil {
		t.Fatalf("send %s with SCM_RIGHTS: %v", name, err)
	}
	return startHolder(t, name, []*os.File{recv}, nil)
}

// RingHolder holds a tap through an io_uring's fixed-file table.
type RingHolder struct {
	*Holder
	t testing.TB
}

// HoldIOUringFixed attaches a queue to the tap called name, registers its
// descriptor as a fixed file of a new io_uring (IORING_REGISTER_FILES),
// closes the descriptor and hands the ring to a child process, as a VMM
// with an io_uring backend would. The tap's file is then in no process's
// descriptor table, only in the ring's file table: /proc/PID/fd of the
// child shows anon_inode:[io_uring], and the ring's fdinfo lists it under
// UserFiles.
func HoldIOUringFixed(t testing.TB, ns *NS, name string, mode tun.Mode) *RingHolder {
	t.Helper()
	f := openTap(t, ns, name, mode)
	defer f.Close()
	var params [120]byte // struct io_uring_params, all zero
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		t.Fatalf("io_uring_setup: %v", errno)
	}
	ring := os.NewFile(fd, "io_uring")
	defer ring.Close()
	files := []int32{int32(f.Fd())}
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, ring.Fd(), ioringRegisterFiles,
		uintptr(unsafe.Pointer(&files[0])), uintptr(len(files)), 0, 0); errno != 0 {
		t.Fatalf("register %s as an io_uring fixed file: %v", name, errno)
	}
	h := &RingHolder{Holder: startHolder(t, name, []*os.File{ring}, nil), t: t}
	t.Cleanup(h.Release)
	return h
}

// Release unregisters the ring's files and ends the holder. Killing alone
// would not do: the kernel frees a ring in a workqueue after its last file
// closes (io_ring_exit_work), so the tap would stay held for tens of
// milliseconds after the child is gone. Unregistering through a copy of
// the child's ring descriptor (pidfd_getfd) closes the tap's file before
// Release returns. A child that something else already killed has closed
// its ring itself, and the tap goes free when that work runs. It is
// idempotent.
func (h *RingHolder) Release() {
	if h.cmd.ProcessState != nil {
		return
	}
	defer h.Holder.Release()
	exited := func(err error) bool { return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EBADF) }
	pidfd, err := unix.PidfdOpen(h.PID(), 0)
	if err != nil {
		if !exited(err) {
			h.t.Errorf("release io_uring holder %d: pidfd_open: %v", h.PID(), err)
		}
		return
	}
	defer unix.Close(pidfd)
	ring, err := unix.PidfdGetfd(pidfd, 3, 0)
	if err != nil {
		if !exited(err) {
			h.t.Errorf("release io_uring holder %d: pidfd_getfd: %v", h.PID(), err)
		}
		return
	}
	defer unix.Close(ring)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(ring), ioringUnregisterFiles, 0, 0, 0, 0); errno != 0 {
		h.t.Errorf("release io_uring holder %d: IORING_UNREGISTER_FILES: %v", h.PID(), errno)
	}
}

// HoldInPIDNamespace hands a queue of the tap called name to a child that
// is PID 1 of a new PID namespace (CLONE_NEWPID), as a VMM in a container
// would be. From the test's namespace the child is an ordinary process;
// from its own it is pid 1. Release kills it.
func HoldInPIDNamespace(t testing.TB, ns *NS, name string, mode tun.Mode) *Holder {
	t.Helper()
	f := openTap(t, ns, name, mode)
	defer f.Close()
	return startHolder(t, name, []*os.File{f}, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID})
}

// HoldAs hands a queue of the tap called name to a child running as uid,
// with gid the same number and no supplementary groups and no
// capabilities: a VMM run as the qemu user. Release kills it.
func HoldAs(t testing.TB, ns *NS, name string, mode tun.Mode, uid uint32) *Holder {
	t.Helper()
	f := openTap(t, ns, name, mode)
	defer f.Close()
	return startHolder(t, name, []*os.File{f}, &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}},
	})
}

// OtherUserProcess starts a long-lived process of uid and gid Nobody that
// holds nothing: another user's process on the node, which a scanner may
// not be allowed to read. It is killed when t ends; it returns its pid.
func OtherUserProcess(t testing.TB) int {
	t.Helper()
	RequirePrivileged(t)
	cmd := exec.Command("sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: Nobody, Gid: Nobody, Groups: []uint32{}},
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a process as uid %d: %v", Nobody, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

func openTap(t testing.TB, ns *NS, name string, mode tun.Mode) *os.File {
	t.Helper()
	f, err := tun.Open(ns.File, name, mode)
	if err != nil {
		t.Fatalf("attach a queue of %s: %v", name, err)
	}
	return f
}

// startHolder starts `sleep 3600` with files as its descriptors 3, 4, ...
// and attr, and registers its end with t. The caller closes its copies.
func startHolder(t testing.TB, name string, files []*os.File, attr *syscall.SysProcAttr) *Holder {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	cmd.ExtraFiles = files
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start holder of %s: %v", name, err)
	}
	h := &Holder{cmd: cmd}
	t.Cleanup(h.Release)
	return h
}
