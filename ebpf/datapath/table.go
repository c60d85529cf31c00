package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// ErrUnknownMap: no map of the collection has the name asked for.
var ErrUnknownMap = errors.New("unknown map")

// batchChunk is how many rows one BPF_MAP_LOOKUP_BATCH call asks for.
const batchChunk = 4096

// Table is one map of the collection with typed keys and values. Get and
// Delete of a missing key return errors wrapping ebpf.ErrKeyNotExist.
type Table[K, V any] struct {
	name   string
	m      *ebpf.Map
	locked bool // values hold a bpf_spin_lock: written and read under it
	encK   func(K) (any, error)
	encV   func(V) (any, error)
	get    func(K) (V, error)
	dumpFn func(limit int, batch bool) ([]Row[K, V], error)
}

// newTable builds a Table over m whose kernel layout is RK, RV (the types
// bpf2go generated from the C source) and whose caller-facing types are K, V.
func newTable[K, V, RK, RV any](name string, m *ebpf.Map,
	encK func(K) (RK, error), decK func(RK) K,
	encV func(V) (RV, error), decV func(RV) V,
) *Table[K, V] {
	t := &Table[K, V]{name: name, m: m}
	t.encK = func(k K) (any, error) {
		rk, err := encK(k)
		return &rk, err
	}
	t.encV = func(v V) (any, error) {
		rv, err := encV(v)
		return &rv, err
	}
	t.get = func(k K) (V, error) {
		var zero V
		rk, err := encK(k)
		if err != nil {
			return zero, err
		}
		var rv RV
		if err := m.LookupWithFlags(&rk, &rv, t.lookupFlags()); err != nil {
			return zero, err
		}
		return decV(rv), nil
	}
	t.dumpFn = func(limit int, batch bool) ([]Row[K, V], error) {
		var rows []Row[K, V]
		add := func(rk RK, rv RV) bool {
			rows = append(rows, Row[K, V]{Key: decK(rk), Value: decV(rv)})
			return limit <= 0 || len(rows) < limit
		}
		if batch {
			err := dumpBatch(m, limit, t.lookupFlags(), add)
			if !errors.Is(err, ebpf.ErrNotSupported) {
				return rows, err
			}
			rows = rows[:0]
		}
		var rk RK
		var rv RV
		it := m.Iterate()
		for it.Next(&rk, &rv) && add(rk, rv) {
		}
		return rows, it.Err()
	}
	return t
}

// newLockedTable is newTable for a map whose values hold a bpf_spin_lock:
// every write and every read but an iteration's goes under the lock, so
// that the program, which reads them under it too, never sees half of one.
func newLockedTable[K, V, RK, RV any](name string, m *ebpf.Map,
	encK func(K) (RK, error), decK func(RK) K,
	encV func(V) (RV, error), decV func(RV) V,
) *Table[K, V] {
	t := newTable(name, m, encK, decK, encV, decV)
	t.locked = true
	return t
}

func (t *Table[K, V]) lookupFlags() ebpf.MapLookupFlags {
	if t.locked {
		return ebpf.LookupLock
	}
	return 0
}

func dumpBatch[RK, RV any](m *ebpf.Map, limit int, flags ebpf.MapLookupFlags, add func(RK, RV) bool) error {
	chunk := batchChunk
	if limit > 0 {
		chunk = min(chunk, limit)
	}
	chunk = min(chunk, int(m.MaxEntries()))
	keys, vals := make([]RK, chunk), make([]RV, chunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, &ebpf.BatchOptions{ElemFlags: uint64(flags)})
		for i := range n {
			if !add(keys[i], vals[i]) {
				return nil
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Name is the map's name in the collection and under the pin folder.
func (t *Table[K, V]) Name() string { return t.name }

// Map is the underlying map, for attaching and for tests.
func (t *Table[K, V]) Map() *ebpf.Map { return t.m }

// Put writes one row.
func (t *Table[K, V]) Put(k K, v V) error {
	flags := ebpf.UpdateAny
	if t.locked {
		// In place when the row exists: a replaced element would go back
		// to the map's free list under a reader.
		flags |= ebpf.UpdateLock
	}
	return t.write("put", k, v, flags)
}

// Create writes one row that must not exist yet; an existing one is left
// as it is and the error wraps ebpf.ErrKeyExist.
func (t *Table[K, V]) Create(k K, v V) error {
	return t.write("create", k, v, ebpf.UpdateNoExist)
}

func (t *Table[K, V]) write(op string, k K, v V, flags ebpf.MapUpdateFlags) error {
	rk, err := t.encK(k)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, t.name, err)
	}
	rv, err := t.encV(v)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, t.name, err)
	}
	if err := t.m.Update(rk, rv, flags); err != nil {
		return fmt.Errorf("%s %s: %w", op, t.name, err)
	}
	return nil
}

// Get reads one row.
func (t *Table[K, V]) Get(k K) (V, error) {
	v, err := t.get(k)
	if err != nil {
		return v, fmt.Errorf("get %s: %w", t.name, err)
	}
	return v, nil
}

// Delete removes one row; a missing row is ebpf.ErrKeyNotExist.
func (t *Table[K, V]) Delete(k K) error {
	rk, err := t.encK(k)
	if err != nil {
		return fmt.Errorf("delete %s: %w", t.name, err)
	}
	if err := t.m.Delete(rk); err != nil {
		return fmt.Errorf("delete %s: %w", t.name, err)
	}
	return nil
}

// Dump returns up to limit rows (limit <= 0: all), by batch look-up where the
// kernel supports it for the map and by iteration otherwise. Rows changed
// during a dump may be missed or seen twice, as with any map walk.
func (t *Table[K, V]) Dump(limit int) ([]Row[K, V], error) {
	rows, err := t.dumpFn(limit, true)
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", t.name, err)
	}
	return rows, nil
}

// DumpIterate is Dump by iteration only: the fallback, measured against
// batch look-up by the benchmarks.
func (t *Table[K, V]) DumpIterate(limit int) ([]Row[K, V], error) {
	rows, err := t.dumpFn(limit, false)
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", t.name, err)
	}
	return rows, nil
}

// Layout describes a map for views: its kind, sizes and capacity.
type Layout struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	KeySize    uint32 `json:"keySize"`
	ValueSize  uint32 `json:"valueSize"`
	MaxEntries uint32 `json:"maxEntries"`
}

// Layout describes the table's map.
func (t *Table[K, V]) Layout() Layout {
	return Layout{Name: t.name, Type: t.m.Type().String(), KeySize: t.m.KeySize(), ValueSize: t.m.ValueSize(), MaxEntries: t.m.MaxEntries()}
}

// DumpAny is Dump with untyped rows, for views that serve any map by name.
func (t *Table[K, V]) DumpAny(limit int) ([]Row[any, any], error) {
	rows, err := t.Dump(limit)
	return untyped(rows), err
}

// untyped returns rows with their types erased, for views.
func untyped[K, V any](rows []Row[K, V]) []Row[any, any] {
	out := make([]Row[any, any], len(rows))
	for i, r := range rows {
		out[i] = Row[any, any]{Key: r.Key, Value: r.Value}
	}
	return out
}

// AnyTable is what every Table offers without its types.
type AnyTable interface {
	Name() string
	Map() *ebpf.Map
	Layout() Layout
	DumpAny(limit int) ([]Row[any, any], error)
}
