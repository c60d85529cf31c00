// Package brakefile keeps the mass-removal brake's memory (reclaim.BrakeMemory)
// in a file on the node, so that a restart of the daemon (a liveness probe,
// an OOM kill, a DaemonSet rollout) during an incident finds the brake as
// it left it.
//
// The file is replaced atomically and durably: written beside itself,
// synced, renamed over the old one, and the folder synced, so that a reader
// finds the old memory or the new, also after a SIGKILL or a power loss.
// A missing file is no history (a new node). A file that cannot be read is
// no history either, but the daemon cannot tell what the brake held, so
// Load moves it aside (kept for an operator) and says so with ErrUnreadable:
// the daemon then starts with the brake engaged.
package brakefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// DefaultPath is where the daemon keeps the brake's memory: a hostPath, so
// that it survives the container; not under /run, so that it survives a
// reboot too, since an incident can outlast one.
const DefaultPath = "/var/lib/galactic/node/brake.json"

// version is the file's format; a file of another version is unreadable,
// so that a downgrade never reads a memory it would misunderstand.
const version = 1

// ErrUnreadable says the file existed but could not be read: it was moved
// aside.
var ErrUnreadable = errors.New("brake memory unreadable")

// maxSize bounds what Load reads: the memory holds at most a few hundred
// samples and the accepted taps of one node, well under this.
const maxSize = 4 << 20

// File is the brake's memory at Path; it implements reclaim.BrakeMemoryStore.
type File struct {
	Path string
}

type fileJSON struct {
	Version int                  `json:"version"`
	Saved   time.Time            `json:"saved"`
	Memory  *reclaim.BrakeMemory `json:"memory"`
}

// Load reads the memory. A missing file is the zero memory and no error. A
// file that cannot be read is moved to a name beside it that says when, and
// the error wraps ErrUnreadable and names where it went.
func (f File) Load() (reclaim.BrakeMemory, error) {
	b, err := readBounded(f.Path)
	if errors.Is(err, os.ErrNotExist) {
		return reclaim.BrakeMemory{}, nil
	}
	if err == nil {
		var j fileJSON
		switch derr := json.Unmarshal(b, &j); {
		case derr != nil:
			err = derr
		case j.Version != version:
			err = fmt.Errorf("format version %d, this build reads %d", j.Version, version)
		case j.Memory == nil:
			err = errors.New("no memory in it")
		default:
			return *j.Memory, nil
		}
	}
	to := fmt.Sprintf("%s.unreadable-%s", f.Path, time.Now().UTC().Format("20060102T150405Z"))
	if rerr := os.Rename(f.Path, to); rerr != nil {
		return reclaim.BrakeMemory{}, fmt.Errorf("%w: read %s: %w (and it could not be moved aside: %w)", ErrUnreadable, f.Path, err, rerr)
	}
	_ = syncDir(filepath.Dir(f.Path))
	return reclaim.BrakeMemory{}, fmt.Errorf("%w: read %s: %w (moved to %s)", ErrUnreadable, f.Path, err, to)
}

func readBounded(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	if st.Size() > maxSize {
		return nil, fmt.Errorf("%d bytes, more than the %d a memory can hold", st.Size(), maxSize)
	}
	return io.ReadAll(io.LimitReader(fh, maxSize+1))
}

// Save replaces the file with m, atomically and durably. Temporary files a
// killed daemon left beside it are removed first: only one daemon writes
// here, and none writes while another starts.
func (f File) Save(m reclaim.BrakeMemory) error {
	dir := filepath.Dir(f.Path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save brake memory: %w", err)
	}
	b, err := json.MarshalIndent(fileJSON{Version: version, Saved: time.Now().UTC(), Memory: &m}, "", "  ")
	if err != nil {
		return fmt.Errorf("save brake memory: %w", err)
	}
	f.removeTemps()
	tmp, err := os.CreateTemp(dir, tempPrefix(f.Path)+"*")
	if err != nil {
		return fmt.Errorf("save brake memory: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("save brake memory: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save brake memory: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save brake memory: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return fmt.Errorf("save brake memory: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("save brake memory: %w", err)
	}
	return nil
}

func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// removeTemps removes what a writer killed between its temporary file and
// the rename left.
func (f File) removeTemps() {
	entries, err := os.ReadDir(filepath.Dir(f.Path))
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix(f.Path)) {
			_ = os.Remove(filepath.Join(filepath.Dir(f.Path), e.Name()))
		}
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
