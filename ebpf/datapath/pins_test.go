package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
)

// regenerate is what brings pins_gen.go back to the object.
const regenerate = "cd ebpf/datapath && go run ./internal/pinsgen -object datapath_bpfel.o -o pins_gen.go (make generate runs it)"

// The table OpenPinned checks pins against is the object's own: every map
// it pins by name, with its layout and inner map, opened into the field
// named for it, and the digest its program pin is named by. A stale table
// would let a CNI verb write pins of another layout, or refuse this
// build's own.
func TestThePinTableIsTheObjects(t *testing.T) {
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	var m datapathMaps
	fields := map[any]string{}
	v := reflect.ValueOf(&m).Elem()
	for i := range v.NumField() {
		fields[v.Field(i).Addr().Interface()] = v.Type().Field(i).Tag.Get("ebpf")
	}
	var want, got []string
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinByName {
			want = append(want, name)
		}
	}
	for _, p := range m.pinnedMaps() {
		got = append(got, p.spec.Name)
		if field := fields[any(p.into)]; field != p.spec.Name {
			t.Errorf("%s is opened into the field of %q", p.spec.Name, field)
		}
		ms := spec.Maps[p.spec.Name]
		if ms == nil {
			continue
		}
		if d := pinLayoutDiff(p.spec, ms); d != "" {
			t.Errorf("%s: the table says %s: run %s", p.spec.Name, d, regenerate)
		}
		if (p.spec.InnerMap == nil) != (ms.InnerMap == nil) {
			t.Errorf("%s: inner map in the table %v, in the object %v: run %s", p.spec.Name, p.spec.InnerMap != nil, ms.InnerMap != nil, regenerate)
		} else if ms.InnerMap != nil {
			if d := pinLayoutDiff(p.spec.InnerMap, ms.InnerMap); d != "" {
				t.Errorf("%s's inner map: the table says %s: run %s", p.spec.Name, d, regenerate)
			}
		}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the table pins %v, the object %v: run %s", got, want, regenerate)
	}
	sum := sha256.Sum256(_DatapathBytes)
	if objectDigest != hex.EncodeToString(sum[:8]) {
		t.Errorf("objectDigest %s is not the object's: run %s", objectDigest, regenerate)
	}
}

// pinLayoutDiff says how a differs from b in what a pin's layout is, or "".
func pinLayoutDiff(a, b *ebpf.MapSpec) string {
	type layout struct {
		Type                                  ebpf.MapType
		KeySize, ValueSize, MaxEntries, Flags uint32
		Pinning                               ebpf.PinType
	}
	la := layout{a.Type, a.KeySize, a.ValueSize, a.MaxEntries, a.Flags, a.Pinning}
	lb := layout{b.Type, b.KeySize, b.ValueSize, b.MaxEntries, b.Flags, b.Pinning}
	if la == lb {
		return ""
	}
	return fmt.Sprintf("%+v, the object %+v", la, lb)
}
