package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// FragmentTables is the tap_fragments map: one table per interface of the
// decisions on its fragmented datagrams' first fragments, which the program
// gives their later fragments. A table per interface, so that no tenant's
// datagrams make room among another's; the program keeps them, and an
// interface without one has every later fragment denied.
type FragmentTables struct {
	m     *ebpf.Map
	inner *ebpf.MapSpec
}

// Name is the map's name in the collection and under the pin folder.
func (f *FragmentTables) Name() string { return "tap_fragments" }

// Map is the outer map.
func (f *FragmentTables) Map() *ebpf.Map { return f.m }

// Layout describes the outer map.
func (f *FragmentTables) Layout() Layout {
	return Layout{Name: f.Name(), Type: f.m.Type().String(), KeySize: f.m.KeySize(), ValueSize: f.m.ValueSize(), MaxEntries: f.m.MaxEntries()}
}

// Ensure gives ifindex its table unless it has one: registering an
// interface again keeps its datagrams in flight.
func (f *FragmentTables) Ensure(ifindex uint32) error {
	if ifindex == 0 {
		return fmt.Errorf("put %s: ifindex 0: %w", f.Name(), ErrInvalidRow)
	}
	if _, err := f.Get(ifindex); err == nil {
		return nil
	}
	if f.inner == nil {
		return fmt.Errorf("put %s: no inner map layout", f.Name())
	}
	spec := f.inner.Copy()
	spec.Name = "tap_frags"
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("put %s: create table of ifindex %d: %w", f.Name(), ifindex, err)
	}
	defer inner.Close() // the outer map holds its own reference
	err = f.m.Update(ifindex, inner, ebpf.UpdateNoExist)
	if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("put %s: ifindex %d: %w", f.Name(), ifindex, err)
	}
	return nil
}

// Get returns the kernel's ID of ifindex's table; a missing one is
// ebpf.ErrKeyNotExist.
func (f *FragmentTables) Get(ifindex uint32) (ebpf.MapID, error) {
	var id uint32
	if err := f.m.Lookup(ifindex, &id); err != nil {
		return 0, fmt.Errorf("get %s: %w", f.Name(), err)
	}
	return ebpf.MapID(id), nil
}

// Delete removes ifindex's table; the kernel frees it with its last
// reference. A missing one is ebpf.ErrKeyNotExist.
func (f *FragmentTables) Delete(ifindex uint32) error {
	if err := f.m.Delete(ifindex); err != nil {
		return fmt.Errorf("delete %s: %w", f.Name(), err)
	}
	return nil
}

// Dump returns up to limit interfaces that have a table (limit <= 0: all),
// with their tables' IDs.
func (f *FragmentTables) Dump(limit int) ([]Row[uint32, ebpf.MapID], error) {
	var rows []Row[uint32, ebpf.MapID]
	var k, id uint32
	it := f.m.Iterate()
	for (limit <= 0 || len(rows) < limit) && it.Next(&k, &id) {
		rows = append(rows, Row[uint32, ebpf.MapID]{Key: k, Value: ebpf.MapID(id)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump %s: %w", f.Name(), err)
	}
	return rows, nil
}

// DumpAny is Dump with untyped rows.
func (f *FragmentTables) DumpAny(limit int) ([]Row[any, any], error) {
	rows, err := f.Dump(limit)
	return untyped(rows), err
}
