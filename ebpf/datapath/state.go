package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// StateSubdir is the folder under the pin folder that holds the program's
// state maps: the per-CPU cache of route answers, the epoch they are
// checked against, and the node daemon's view of the host's addresses.
// Every CNI ADD loads its own instance of the program, so maps that were
// not pinned would be created once per tap; pinned, every
// instance shares one. They hold no rows of any interface (a folder, so that
// walks of the pin folder's per-interface maps skip them) and nothing that
// cannot be lost: a state map whose layout differs from this build's is
// replaced, where a row map would be an error.
const StateSubdir = "state"

// stateMapNames are the maps of the program that hold state, not rows.
var stateMapNames = []string{"route_cache", "route_epoch", "host_filter", "host_view", "decision_totals", "drop_records", "drop_budgets", "drop_records_lost"}

// stateMaps opens the state maps pinned in dir, creating and pinning those
// missing or of another layout.
func stateMaps(spec *ebpf.CollectionSpec, dir string) (map[string]*ebpf.Map, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state map folder: %w", err)
	}
	out := make(map[string]*ebpf.Map, len(stateMapNames))
	for _, name := range stateMapNames {
		m, err := stateMap(spec.Maps[name], filepath.Join(dir, name))
		if err != nil {
			for _, m := range out {
				m.Close()
			}
			return nil, fmt.Errorf("state map %s: %w", name, err)
		}
		out[name] = m
	}
	return out, nil
}

func stateMap(ms *ebpf.MapSpec, path string) (*ebpf.Map, error) {
	if ms == nil {
		return nil, errors.New("not in the program's spec")
	}
	ms = ms.Copy()
	ms.Pinning = ebpf.PinNone
	for range 3 {
		m, err := ebpf.LoadPinnedMap(path, nil)
		switch {
		case err == nil && ms.Compatible(m) == nil:
			return m, nil
		case err == nil:
			// Another build's layout: state only, replaced.
			unpinErr := m.Unpin()
			m.Close()
			if unpinErr != nil {
				return nil, fmt.Errorf("unpin %s of another layout: %w", path, unpinErr)
			}
		case !errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("load pinned %s: %w", path, err)
		}
		m, err = ebpf.NewMap(ms)
		if err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		err = m.Pin(path)
		if err == nil {
			return m, nil
		}
		m.Close()
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("pin %s: %w", path, err)
		}
		// Another process pinned its own first: use that one.
	}
	return nil, fmt.Errorf("%s: kept changing while being pinned", path)
}
