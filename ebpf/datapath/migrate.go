package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// migratingSuffix names a map being made beside the pin it replaces; bpffs
// refuses dots in names.
const migratingSuffix = "_migrating"

// migrateCapacities replaces each pinned row map whose capacity alone
// differs from spec's by a map of spec's capacity that holds the same rows,
// made beside it and renamed over its pin (a rename in bpffs is atomic). The
// programs already attached keep reading the old map until the daemon moves
// their taps to its program, which reads the new one: every tap is judged
// by its rows throughout. The old map goes with the last program that holds
// it. A map of another type, key or value size or flags is left alone: Load
// then refuses it, naming it. Returns the names of the maps it migrated.
//
// The approach is Cilium's for its own pinned maps (a new map made beside
// the old, its pin swapped in once filled, the old one kept by the programs
// that still use it), with the rows copied here rather than written again by
// their owner.
func migrateCapacities(spec *ebpf.CollectionSpec, pinDir string) ([]string, error) {
	var names []string
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinByName {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	// Only when every pinned map is this build's or differs by capacity
	// alone: otherwise Load refuses the pins, and they must stay as they
	// were for the build that can read them.
	var todo []string
	for _, name := range names {
		diff, err := capacityOnly(spec.Maps[name], filepath.Join(pinDir, name))
		if err != nil {
			return nil, fmt.Errorf("migrate map %s: %w", name, err)
		}
		switch diff {
		case layoutOther:
			return nil, nil
		case layoutCapacity:
			todo = append(todo, name)
		}
	}
	var migrated []string
	for _, name := range todo {
		if err := migrateCapacity(spec.Maps[name], filepath.Join(pinDir, name)); err != nil {
			return migrated, fmt.Errorf("migrate map %s: %w", name, err)
		}
		migrated = append(migrated, name)
	}
	return migrated, nil
}

// layoutDiff is how a pinned map differs from this build's.
type layoutDiff int

const (
	layoutSame     layoutDiff = iota // or not pinned
	layoutCapacity                   // its capacity alone
	layoutOther
)

func capacityOnly(ms *ebpf.MapSpec, pin string) (layoutDiff, error) {
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return layoutSame, nil
	}
	if err != nil {
		return layoutSame, err
	}
	defer func() { _ = m.Close() }()
	switch {
	case ms.Compatible(m) == nil:
		return layoutSame, nil
	case m.Type() == ms.Type && m.KeySize() == ms.KeySize && m.ValueSize() == ms.ValueSize && m.Flags() == ms.Flags:
		return layoutCapacity, nil
	}
	return layoutOther, nil
}

func migrateCapacity(ms *ebpf.MapSpec, pin string) error {
	old, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		return err
	}
	defer func() { _ = old.Close() }()
	next := ms.Copy()
	next.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(next)
	if err != nil {
		return fmt.Errorf("new map of %d entries: %w", next.MaxEntries, err)
	}
	defer func() { _ = m.Close() }()
	if err := copyRows(old, m, valueHasSpinLock(ms)); err != nil {
		return err
	}
	tmp := pin + migratingSuffix
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := m.Pin(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, pin); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("swap pins: %w", err)
	}
	return nil
}

// copyRows copies every row of from into to: values of a map with a spin
// lock are read under it, and a map of maps gets the same inner maps.
func copyRows(from, to *ebpf.Map, locked bool) error {
	key := make([]byte, from.KeySize())
	var keys [][]byte
	it := from.Iterate()
	var discard []byte
	for it.Next(&key, &discard) {
		keys = append(keys, slices.Clone(key))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read rows: %w", err)
	}
	if len(keys) > int(to.MaxEntries()) {
		return fmt.Errorf("%d rows do not fit in %d entries", len(keys), to.MaxEntries())
	}
	ofMaps := from.Type() == ebpf.HashOfMaps || from.Type() == ebpf.ArrayOfMaps
	for _, k := range keys {
		if ofMaps {
			var id uint32
			if err := from.Lookup(k, &id); errors.Is(err, ebpf.ErrKeyNotExist) {
				continue // removed meanwhile
			} else if err != nil {
				return fmt.Errorf("read row: %w", err)
			}
			inner, err := ebpf.NewMapFromID(ebpf.MapID(id))
			if err != nil {
				return fmt.Errorf("inner map %d: %w", id, err)
			}
			err = to.Put(k, inner)
			_ = inner.Close()
			if err != nil {
				return fmt.Errorf("write row: %w", err)
			}
			continue
		}
		v := make([]byte, from.ValueSize())
		var flags ebpf.MapLookupFlags
		if locked {
			flags = ebpf.LookupLock
		}
		if err := from.LookupWithFlags(k, &v, flags); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		} else if err != nil {
			return fmt.Errorf("read row: %w", err)
		}
		if err := to.Put(k, v); err != nil {
			return fmt.Errorf("write row: %w", err)
		}
	}
	return nil
}

// valueHasSpinLock tells whether ms's values hold a bpf_spin_lock.
func valueHasSpinLock(ms *ebpf.MapSpec) bool {
	st, ok := btf.UnderlyingType(ms.Value).(*btf.Struct)
	if !ok {
		return false
	}
	for _, m := range st.Members {
		if s, ok := btf.UnderlyingType(m.Type).(*btf.Struct); ok && s.Name == "bpf_spin_lock" {
			return true
		}
	}
	return false
}
