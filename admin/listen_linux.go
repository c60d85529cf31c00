package admin

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// restrictSocket gives the socket at path mode 0600 (0660 and group
// readGroup, when given) without following a symlink: it opens path itself
// (O_PATH|O_NOFOLLOW), checks that it is a socket, and changes exactly that
// inode through /proc.
func restrictSocket(path string, readGroup *uint32) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("admin socket %s: open to set its mode: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("admin socket %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("admin socket %s was replaced by something not a socket: refused", path)
	}
	inode := "/proc/self/fd/" + strconv.Itoa(fd)
	if readGroup == nil {
		if err := os.Chmod(inode, 0o600); err != nil {
			return fmt.Errorf("admin socket %s: set mode 0600: %w", path, err)
		}
		return nil
	}
	// Group first: the mode that opens it to the group comes last.
	if err := os.Chown(inode, -1, int(*readGroup)); err != nil {
		return fmt.Errorf("admin socket %s: give it to group %d: %w", path, *readGroup, err)
	}
	if err := os.Chmod(inode, 0o660); err != nil {
		return fmt.Errorf("admin socket %s: set mode 0660: %w", path, err)
	}
	return nil
}
