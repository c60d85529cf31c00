//go:build !linux

package admin

import (
	"errors"
	"fmt"
)

// restrictSocket refuses off Linux: setting the socket's mode without
// following a symlink needs O_PATH and /proc/self/fd, which are Linux's, and
// a socket left at the umask's mode could be open to anyone.
func restrictSocket(path string, _ *uint32) error {
	return fmt.Errorf("admin socket %s: setting its mode safely is Linux-only: %w", path, errors.ErrUnsupported)
}
