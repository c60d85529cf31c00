package link

import "golang.org/x/sys/unix"

// socketNetNS opens the network namespace a socket lives in (SIOCGSKNS,
// Linux 4.9) and returns its file descriptor.
func socketNetNS(fd uintptr) (int, error) {
	return unix.IoctlRetInt(int(fd), unix.SIOCGSKNS)
}
