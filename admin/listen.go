package admin

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/datum-cloud/galactic-node/internal/connlimit"
)

// Bounds of the admin listeners; SECURITY.md states them with the figures
// measured under a flood (the metrics port's are internal/metricsserve's).
// Every connection costs at most a header's worth of memory plus buffers,
// and there are at most so many of them.
const (
	// AdminMaxHeaderBytes leaves room for a Kubernetes token (a JWT of a
	// few KiB) in Authorization.
	AdminMaxHeaderBytes = 16 << 10
	// Open connections per listener from other hosts, from one IP address
	// of theirs, and from this host itself (loopback, or the address it
	// reached), which a flood from elsewhere cannot take. A unix socket is
	// bound only by AdminMaxConns.
	AdminMaxConns          = 64
	AdminMaxConnsPerSource = 8
	AdminMaxConnsFromHost  = 8
	// SocketFolderMode is the mode of a socket folder the daemon creates.
	SocketFolderMode = 0o750
)

// NewServer wraps h in an http.Server for the admin API whose timeouts cut
// off slow clients: a client that never finishes its headers is dropped
// after 5 s, an idle one after a minute. Writes may take up to 2 min, the
// bound of a forced pass waiting for one in flight.
func NewServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    AdminMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// Unix-socket callers are known by their kernel credentials.
		ConnContext: PeerContext,
	}
}

// LimitAdmin bounds the connections of an admin listener; name says which
// in the log. The metrics port's are internal/metricsserve's.
func LimitAdmin(l net.Listener, name string, log *slog.Logger) *connlimit.Listener {
	return connlimit.New(l, connlimit.Limits{Total: AdminMaxConns, PerSource: AdminMaxConnsPerSource, Self: AdminMaxConnsFromHost}, name, log)
}

// ListenUnix listens on the admin socket path with mode 0600, or, given a
// read group, 0660 and that group, so that its members can connect (their
// role is still decided per connection from the kernel's credentials).
//
// Its folder is created with SocketFolderMode if missing. An existing
// folder must be owned by this user or root, not writable by group or
// others, and reached without symlinks: whoever can write the folder or
// swap a link in the path could replace the socket. Something already at
// path is removed only when it is a socket nothing answers on (one a crashed
// daemon left); a live socket, a symlink or any other file is an error and
// left alone.
func ListenUnix(path string, readGroup *uint32) (net.Listener, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("admin socket %s: %w", path, err)
	}
	dir := filepath.Dir(abs)
	if err := os.MkdirAll(dir, SocketFolderMode); err != nil {
		return nil, fmt.Errorf("admin socket folder: %w", err)
	}
	if err := checkFolder(dir); err != nil {
		return nil, err
	}
	if err := removeStale(abs); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", abs)
	if err != nil {
		return nil, fmt.Errorf("admin socket %s: %w", abs, err)
	}
	if err := restrictSocket(abs, readGroup); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// checkFolder refuses a socket folder others could use to replace the
// socket.
func checkFolder(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("admin socket folder %s: %w", dir, err)
	}
	if real != dir {
		return fmt.Errorf("admin socket folder %s is reached through a symlink (to %s): give the real path", dir, real)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("admin socket folder: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("admin socket folder %s is not a folder", dir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("admin socket folder %s has mode %04o: it is writable by group or others, who could replace the socket", dir, fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() && st.Uid != 0 {
		return fmt.Errorf("admin socket folder %s is owned by uid %d, who could open it to others", dir, st.Uid)
	}
	return nil
}

// removeStale removes path if it is a socket nothing listens on, and
// refuses anything else that is there.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("admin socket %s: %w", path, err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("admin socket %s is a symlink: refused, and left alone", path)
	case fi.Mode()&fs.ModeSocket == 0:
		return fmt.Errorf("admin socket %s exists and is not a socket (%s): refused, and left alone", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("admin socket %s is in use by a running daemon", path)
	}
	// Only a refused connection proves nothing listens: a live daemon
	// whose backlog is full answers EAGAIN, and keeps its socket.
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("admin socket %s: cannot tell whether a daemon listens on it: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove stale admin socket %s: %w", path, err)
	}
	return nil
}
