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
}

// networkDir is the folder of network's records. The network name becomes a
// path element, so one that could leave the folder is refused.
func networkDir(dataDir, network string) (string, error) {
	if network == "" || network == "." || network == ".." || strings.ContainsAny(network, "/\x00") {
		return "", fmt.Errorf("%w: network name %q cannot name a state folder", errConfig, network)
	}
	return filepath.Join(dataDir, network), nil
}

// writeRecord writes r atomically: a reader sees the old record or the new.
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
	tmp, err := os.CreateTemp(dir, ".tmp-"+r.Tap+"-*")
	if err != nil {
		return fmt.Errorf("record tap %s: %w", r.Tap, err)
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

// readRecords returns network's records; a network with none has no folder.
func readRecords(dataDir, network string) ([]record, error) {
	dir, err := networkDir(dataDir, network)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read records of network %s: %w", network, err)
	}
	var out []record
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read record %s of network %s: %w", e.Name(), network, err)
		}
		var r record
		if err := json.Unmarshal(b, &r); err != nil || r.Tap != e.Name() {
			return nil, fmt.Errorf("record %s of network %s is malformed", e.Name(), network)
		}
		out = append(out, r)
	}
	return out, nil
}

// removeRecord removes the record of tap; a missing one is fine.
func removeRecord(dataDir, network, tap string) error {
	dir, err := networkDir(dataDir, network)
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, tap)); err != nil && !errors.Is(err, os.ErrNotExist) {
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
