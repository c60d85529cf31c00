package admin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Role is what a caller may do.
type Role int

const (
	RoleNone  Role = iota
	RoleRead       // read routes
	RoleAdmin      // read routes and forcing passes
)

func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

type tokenEntry struct {
	role Role
	sum  [sha256.Size]byte
}

// maxTokenFileBytes bounds what is read of a token file.
const maxTokenFileBytes = 1 << 20

// TokenFile holds bearer tokens read from a file of lines "<role> <token>"
// (role read or admin; a line whose first non-blank character is '#' is a
// comment, and a '#' anywhere else is part of the line). Tokens are kept
// only as SHA-256 sums and compared in constant time; they are never
// logged.
//
// The file must not be readable or writable by group or others. Which file
// and what it says (its device and inode, and the SHA-256 of its content)
// decide whether it changed: a file renamed over the old one with the same
// size and mtime (cp -p, rsync -t, tar) is still a change.
type TokenFile struct {
	path string

	mu      sync.RWMutex
	entries []tokenEntry
	loaded  fileID // what entries were read from; zero after a revocation
	// seen is a new content read once: it is taken only when the next
	// look reads it again, because a rewrite in place (truncate, then
	// write) shows an empty file between the two, which would otherwise
	// revoke every token for an instant, and for good if the write that
	// follows is refused.
	seen fileID
	// problem is the last trouble logged, so that Watch says each once.
	problem string
}

// fileID is what makes a token file's content the same as before.
type fileID struct {
	dev, ino uint64
	sum      [sha256.Size]byte
}

// errUnreadable marks a file that cannot be read at all (gone, not a regular
// file, an I/O error): every token from it is revoked. Other errors (too
// open, malformed) leave the tokens in force.
var errUnreadable = errors.New("unreadable")

// LoadTokenFile reads path. A missing or unreadable file, one readable by
// group or others, and a malformed one are errors; a malformed line is named
// by its number, never its content.
func LoadTokenFile(path string) (*TokenFile, error) {
	f := &TokenFile{path: path}
	id, entries, err := readTokenFile(path)
	if err != nil {
		return nil, err
	}
	f.entries, f.loaded = entries, id
	return f, nil
}

// readTokenFile opens path (following a symlink, as a Kubernetes Secret
// volume's files are), and checks and parses what the open file holds.
func readTokenFile(path string) (fileID, []tokenEntry, error) {
	file, err := os.Open(path)
	if err != nil {
		return fileID{}, nil, fmt.Errorf("token file: %w: %w", errUnreadable, err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return fileID{}, nil, fmt.Errorf("token file %s: %w: %w", path, errUnreadable, err)
	}
	if !fi.Mode().IsRegular() {
		return fileID{}, nil, fmt.Errorf("token file %s: %w: not a regular file", path, errUnreadable)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fileID{}, nil, fmt.Errorf("token file %s has mode %04o: it must not be readable by group or others (nor writable): chmod 0600", path, perm)
	}
	data, err := io.ReadAll(io.LimitReader(file, maxTokenFileBytes+1))
	if err != nil {
		return fileID{}, nil, fmt.Errorf("token file %s: %w: %w", path, errUnreadable, err)
	}
	if len(data) > maxTokenFileBytes {
		return fileID{}, nil, fmt.Errorf("token file %s is larger than %d bytes", path, maxTokenFileBytes)
	}
	id := fileID{sum: sha256.Sum256(data)}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino //nolint:unconvert // Dev is uint64 on Linux, int32 on darwin
	}
	entries, err := parseTokens(data)
	if err != nil {
		return id, nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return id, entries, nil
}

func parseTokens(data []byte) ([]tokenEntry, error) {
	var entries []tokenEntry
	s := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; s.Scan(); n++ {
		fields := strings.Fields(s.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: want \"<role> <token>\" (a comment goes on a line of its own)", n)
		}
		var role Role
		switch fields[0] {
		case "read":
			role = RoleRead
		case "admin":
			role = RoleAdmin
		default:
			return nil, fmt.Errorf("line %d: role must be read or admin", n)
		}
		if len(fields[1]) < 16 {
			return nil, fmt.Errorf("line %d: token shorter than 16 characters", n)
		}
		entries = append(entries, tokenEntry{role: role, sum: sha256.Sum256([]byte(fields[1]))})
	}
	return entries, s.Err()
}

// Watch looks at the file every interval until ctx ends and reloads it when
// its inode or content changed and two looks in a row read the change. A file that is gone or unreadable revokes
// every token (fail closed) until it returns; one readable by group or
// others, or malformed, leaves the tokens in force. Each of these is logged
// once, until the file is loaded again.
func (f *TokenFile) Watch(ctx context.Context, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.check(log)
	}
}

// check is one look of Watch.
func (f *TokenFile) check(log *slog.Logger) {
	id, entries, err := readTokenFile(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case errors.Is(err, errUnreadable):
		revoked := len(f.entries)
		f.entries, f.loaded = nil, fileID{}
		if f.problem != "unreadable" {
			f.problem = "unreadable"
			log.Warn("token file unreadable: every token from it is revoked until it returns", "path", f.path, "revoked", revoked, "error", err)
		}
	case err != nil:
		if problem := fmt.Sprintf("%x:%v", id.sum, err); f.problem != problem {
			f.problem = problem
			log.Warn("token file refused, keeping the tokens in force", "error", err, "tokens", len(f.entries))
		}
	case id == f.loaded:
		f.problem, f.seen = "", fileID{}
	case id != f.seen:
		f.seen = id // taken at the next look if it still reads so
	default:
		f.entries, f.loaded, f.problem, f.seen = entries, id, "", fileID{}
		log.Info("token file reloaded", "path", f.path, "tokens", len(entries))
		if len(entries) == 0 {
			log.Warn("no admin token is configured in the token file", "path", f.path)
		}
	}
}

// Count is the number of tokens in force.
func (f *TokenFile) Count() int {
	if f == nil {
		return 0
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.entries)
}

// Lookup returns the role of token, or RoleNone. It compares against every
// entry without stopping early, so its time does not depend on which entry
// (if any) matched.
func (f *TokenFile) Lookup(token string) Role {
	if f == nil {
		return RoleNone
	}
	sum := sha256.Sum256([]byte(token))
	f.mu.RLock()
	defer f.mu.RUnlock()
	role := RoleNone
	for _, e := range f.entries {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 && e.role > role {
			role = e.role
		}
	}
	return role
}
