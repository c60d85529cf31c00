package cnitap

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultDataDir holds one folder per network, and in it one record per tap
// ADD made for that network, as the reference plugins keep their state.
const DefaultDataDir = "/var/lib/cni/galactic-tap"

// record is what ADD noted of one tap: the network and the attachment (the
// container and its interface name) it was added for. The tap's alias stays
// the owner stamp the reclaim reads; the record is what scopes CNI GC to
// one network.
type record struct {
	Tap         string `json:"tap"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	// NetNS is the sandbox's namespace path (CNI_NETNS): while it exists
	// the runtime has not torn the sandbox down, so its attachment is live.
	// Records written before it was kept have none.
	NetNS string `json:"netns,omitempty"`
	// HostNetNS names the network namespace the tap was made in, as
	// readlink of /proc/self/ns/net names it ("net:[4026531840]"): the
	// only namespace whose link dump can tell that the tap is gone. The
	// initial namespace has the same inode on every boot
	// (PROC_NET_INIT_INO), so the name still holds for records that, in
	// /var/lib, outlive a reboot. Records written before it was kept, or
	// by a plugin that could not tell its namespace, have none.
	HostNetNS string `json:"hostNetns,omitempty"`
}

// networkRecord is a record with the network whose folder holds it.
type networkRecord struct {
	Network string
	record
}

// speaksFor reports whether r still describes tap: the tap carries the stamp
// of the container r names. A record of a tap another container has since
// taken over speaks for nothing.
func (r record) speaksFor(stamp string) bool { return r.ContainerID != "" && r.ContainerID == stamp }

// recordsOfTap returns every network's record of tap. A record that does
// not parse is left for its own network's GC and DEL to move aside.
func recordsOfTap(dataDir, tap string) ([]networkRecord, error) {
	paths, err := filepath.Glob(filepath.Join(dataDir, "*", tap))
	if err != nil {
		return nil, fmt.Errorf("find records of tap %s: %w", tap, err)
	}
	var out []networkRecord
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read record %s: %w", p, err)
		}
		var r record
		if json.Unmarshal(b, &r) != nil || r.Tap != tap {
			continue
		}
		out = append(out, networkRecord{Network: filepath.Base(filepath.Dir(p)), record: r})
	}
	return out, nil
}

// networkDir is the folder of network's records. The network name becomes a
// path element, so one that could leave the folder is refused.
func networkDir(dataDir, network string) (string, error) {
	if network == "" || network == "." || network == ".." || strings.ContainsAny(network, "/\x00") {
		return "", fmt.Errorf("%w: network name %q cannot name a state folder", errConfig, network)
	}
	return filepath.Join(dataDir, network), nil
}

// testHookAfterCreateTemp is nil but in this package's tests, which set it
// (export_test.go) in a child process to SIGKILL it between CreateTemp and
// Rename: the state a plugin killed there leaves.
var testHookAfterCreateTemp func()

// writeRecord writes r atomically: a reader sees the old record or the new,
// also after the writer is killed, since it renames a whole file into place.
//
// Nothing is fsynced. A record describes a tap, its TCX link and its pins,
// which a reboot removes: the only failure an fsync guards against (the
// kernel or the machine going down before the page cache reaches the disk)
// takes what the record describes with it. A record torn by that crash does
// not parse and is moved aside (readRecords); one lost or left describes a
// tap that no longer exists, which GC and the node's collection drop. The
// reference plugins' host-local store does not fsync its reservations
// either (containernetworking/plugins v1.10.0,
// plugins/ipam/host-local/backend/disk/backend.go: Reserve writes and
// closes). docs/operations.md, "What survives a restart", says so.
func writeRecord(dataDir, network string, r record) error {
	dir, err := networkDir(dataDir, network)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("record tap %s: %w", r.Tap, err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("record tap %s: %w", r.Tap, err)
	}
	tmp, err := os.CreateTemp(dir, tempPrefix+r.Tap+"-*")
	if errors.Is(err, os.ErrNotExist) {
		// The daemon's record collection removed the folder, empty,
		// between the two calls.
		if err = os.MkdirAll(dir, 0o700); err == nil {
			tmp, err = os.CreateTemp(dir, tempPrefix+r.Tap+"-*")
		}
	}
	if err != nil {
		return fmt.Errorf("record tap %s: %w", r.Tap, err)
	}
	if testHookAfterCreateTemp != nil {
		testHookAfterCreateTemp()
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("record tap %s: %w", r.Tap, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("record tap %s: %w", r.Tap, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, r.Tap)); err != nil {
		return fmt.Errorf("record tap %s: %w", r.Tap, err)
	}
	return nil
}

// tempPrefix starts the name writeRecord writes a record under before it
// renames it into place: ".tmp-<tap>-<random>".
const tempPrefix = ".tmp-"

// tempTap returns the tap a temp file of writeRecord was written for.
func tempTap(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, tempPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}

// tempsOfTap returns writeRecord's temp files of tap in every network's
// folder.
func tempsOfTap(dataDir, tap string) ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(dataDir, "*", tempPrefix+tap+"-*"))
	if err != nil {
		return nil, fmt.Errorf("find temp files of tap %s: %w", tap, err)
	}
	return paths, nil
}

// tempsIn returns writeRecord's temp files in dir by the tap they were
// written for. Records moved aside (asidePrefix) are not among them.
func tempsIn(dir string) (map[string][]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find temp files in %s: %w", dir, err)
	}
	byTap := map[string][]string{}
	for _, e := range entries {
		if tap, ok := tempTap(e.Name()); ok && e.Type().IsRegular() {
			byTap[tap] = append(byTap[tap], filepath.Join(dir, e.Name()))
		}
	}
	return byTap, nil
}

// removeTemps removes temp files of writeRecord whose writer is dead: one
// killed between CreateTemp and Rename (SIGKILL, OOM, a runtime's timeout)
// leaves its temp file, which every reader skips, forever, and keeps its
// network's folder from ever being removed. The caller holds the VPC lock
// of the files' tap. Every writer of a tap's record holds that lock from
// CreateTemp to Rename (ADD, and GC adopting a tap), and removes its own
// temp file before it lets go, so any temp file of the tap seen under the
// lock is a dead writer's, however young. It returns the files removed.
func removeTemps(paths []string) ([]string, error) {
	var removed []string
	var errs []error
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove temp file %s: %w", p, err))
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// asidePrefix starts the name a record that cannot be read is moved to:
// readRecords skips dot files, so it stops blocking GC and DEL, and an
// operator still finds it.
const asidePrefix = ".unreadable-"

// moveAside moves the unreadable record name out of the way, and returns
// where it went.
func moveAside(dir, name string) (string, error) {
	to := filepath.Join(dir, asidePrefix+name)
	if err := os.Rename(filepath.Join(dir, name), to); err != nil {
		return "", err
	}
	return to, nil
}

// readRecords returns network's records; a network with none has no folder.
// A record that does not parse (truncated by a crash, garbled by hand) is
// moved aside and reported in unreadable, so that one bad file never blocks
// GC or DEL of the whole network; it names no attachment GC could act on.
func readRecords(dataDir, network string) (records []record, unreadable []string, err error) {
	dir, err := networkDir(dataDir, network)
	if err != nil {
		return nil, nil, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read records of network %s: %w", network, err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, nil, fmt.Errorf("read record %s of network %s: %w", e.Name(), network, err)
		}
		var r record
		if err := json.Unmarshal(b, &r); err != nil || r.Tap != e.Name() {
			what := filepath.Join(dir, e.Name())
			if to, err := moveAside(dir, e.Name()); err == nil {
				what += " (moved to " + to + ")"
			}
			unreadable = append(unreadable, what)
			continue
		}
		records = append(records, r)
	}
	return records, unreadable, nil
}

// readRecord reads network's record of tap; a missing or unparseable one is
// the zero record.
func readRecord(dataDir, network, tap string) (record, error) {
	dir, err := networkDir(dataDir, network)
	if err != nil {
		return record{}, err
	}
	b, err := os.ReadFile(filepath.Join(dir, tap))
	if errors.Is(err, os.ErrNotExist) {
		return record{}, nil
	}
	if err != nil {
		return record{}, fmt.Errorf("read record %s of network %s: %w", tap, network, err)
	}
	// One that does not parse is the zero record, which matches no record
	// read before: its network's GC and DEL move it aside.
	var r record
	_ = json.Unmarshal(b, &r)
	return r, nil
}

// removeRecord removes the record of tap; a missing one is fine, also on a
// read-only or full folder, where unlink answers EROFS before it looks.
func removeRecord(dataDir, network, tap string) error {
	dir, err := networkDir(dataDir, network)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, tap)
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove record of tap %s: %w", tap, err)
	}
	return nil
}

// recordedAnywhere reports whether any network recorded tap: such a tap is
// that network's, not a legacy one found by its stamp alone.
func recordedAnywhere(dataDir, tap string) bool {
	matches, _ := filepath.Glob(filepath.Join(dataDir, "*", tap))
	return len(matches) > 0
}

// sandboxLive reports whether the namespace path a record names still
// exists. A runtime removes a sandbox's namespace when it tears the sandbox
// down, so a path that is gone, or one the asking sandbox now uses (the
// runtime reused it), belongs to no live attachment. A record with no path
// says nothing.
func sandboxLive(recorded, asking string) bool {
	if recorded == "" || recorded == asking {
		return false
	}
	_, err := os.Stat(recorded)
	return err == nil
}
