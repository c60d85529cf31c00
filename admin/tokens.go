package admin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
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

// TokenFile holds bearer tokens read from a file of lines "<role> <token>"
// (role read or admin; '#' starts a comment). Tokens are kept only as
// SHA-256 sums and compared in constant time; they are never logged.
type TokenFile struct {
	path string

	mu      sync.RWMutex
	entries []tokenEntry
	modTime time.Time
	size    int64
}

// LoadTokenFile reads path. A malformed line is an error naming its line
// number, never its content.
func LoadTokenFile(path string) (*TokenFile, error) {
	f := &TokenFile{path: path}
	if err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *TokenFile) reload() error {
	fi, err := os.Stat(f.path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	entries, err := parseTokens(data)
	if err != nil {
		return fmt.Errorf("token file %s: %w", f.path, err)
	}
	f.mu.Lock()
	f.entries, f.modTime, f.size = entries, fi.ModTime(), fi.Size()
	f.mu.Unlock()
	return nil
}

func parseTokens(data []byte) ([]tokenEntry, error) {
	var entries []tokenEntry
	s := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; s.Scan(); n++ {
		line := s.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: want \"<role> <token>\"", n)
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

// Watch reloads the file whenever its size or modification time changes,
// until ctx ends. A file that no longer parses is logged and the previous
// tokens stay in force.
func (f *TokenFile) Watch(ctx context.Context, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(f.path)
		if err != nil {
			log.Warn("token file unreadable, keeping the tokens in force", "path", f.path, "error", err)
			continue
		}
		f.mu.RLock()
		changed := !fi.ModTime().Equal(f.modTime) || fi.Size() != f.size
		f.mu.RUnlock()
		if !changed {
			continue
		}
		if err := f.reload(); err != nil {
			log.Warn("token file not reloaded, keeping the tokens in force", "error", err)
			continue
		}
		log.Info("token file reloaded", "path", f.path, "tokens", f.count())
	}
}

func (f *TokenFile) count() int {
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
