package admin

import (
	"errors"
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// unixPeer reads the kernel's credentials of uc's peer (SO_PEERCRED, and
// SO_PEERGROUPS for its supplementary groups).
func unixPeer(uc *net.UnixConn) (Peer, bool, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, false, fmt.Errorf("peer credentials: %w", err)
	}
	var p Peer
	var opErr error
	if err := raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			opErr = fmt.Errorf("SO_PEERCRED: %w", err)
			return
		}
		p = Peer{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid}
		p.Groups, opErr = peerGroups(int(fd))
	}); err != nil {
		return Peer{}, false, fmt.Errorf("peer credentials: %w", err)
	}
	if opErr != nil {
		return Peer{}, false, fmt.Errorf("peer credentials: %w", opErr)
	}
	return p, true, nil
}

// peerGroups reads SO_PEERGROUPS (Linux 4.13), which x/sys/unix has no
// wrapper for: the supplementary groups of the peer when it connected.
func peerGroups(fd int) ([]uint32, error) {
	n := 32
	for {
		buf := make([]uint32, n)
		size := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		switch {
		case errno == 0:
			return buf[:size/4], nil
		case errors.Is(errno, unix.ERANGE) && int(size/4) > n:
			n = int(size / 4) // the kernel said how many it has
		default:
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", errno)
		}
	}
}
