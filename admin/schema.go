package admin

import (
	"encoding"
	"encoding/json"
	"reflect"
)

// The admin API's JSON is one schema for scripts (docs/operations.md, "JSON
// for scripts"): keys are lower-camel, and a list with nothing in it is []
// and never null, so that `jq '.items[0].candidates[]'` iterates nothing on
// a quiet node rather than failing. Go writes a nil slice as null, and the
// reports are built by appending to nil slices in packages that know
// nothing of JSON; rather than ask each of them to allocate empty slices,
// every answer passes through withEmptyLists on its way out.

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// withEmptyLists returns v with every nil slice it holds, at any depth,
// replaced by an empty one. It copies what it changes: v is often shared
// with the daemon (a report in the reclaimer's history), and must not be
// written to. A value that marshals itself (time.Time, a tabular) is left
// as it is; []byte is a string in JSON, not a list; a nil map or pointer
// stays null, as it says "unknown" or "none" (documented per field).
func withEmptyLists(v any) any {
	if v == nil {
		return nil
	}
	return emptyLists(reflect.ValueOf(v)).Interface()
}

func emptyLists(v reflect.Value) reflect.Value {
	t := v.Type()
	if t.Kind() != reflect.Interface && t.Kind() != reflect.Pointer &&
		(t.Implements(jsonMarshaler) || t.Implements(textMarshaler) ||
			reflect.PointerTo(t).Implements(jsonMarshaler) || reflect.PointerTo(t).Implements(textMarshaler)) {
		return v
	}
	switch t.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return v
		}
		out := reflect.New(t.Elem())
		out.Elem().Set(emptyLists(v.Elem()))
		return out
	case reflect.Interface:
		if v.IsNil() {
			return v
		}
		out := reflect.New(t).Elem()
		out.Set(emptyLists(v.Elem()))
		return out
	case reflect.Struct:
		out := reflect.New(t).Elem()
		out.Set(v)
		for i := range t.NumField() {
			// An unexported field is not in the JSON (and cannot be set).
			if f := out.Field(i); f.CanSet() {
				f.Set(emptyLists(v.Field(i)))
			}
		}
		return out
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return v
		}
		if v.IsNil() {
			return reflect.MakeSlice(t, 0, 0)
		}
		out := reflect.MakeSlice(t, v.Len(), v.Len())
		for i := range v.Len() {
			out.Index(i).Set(emptyLists(v.Index(i)))
		}
		return out
	case reflect.Array:
		out := reflect.New(t).Elem()
		for i := range v.Len() {
			out.Index(i).Set(emptyLists(v.Index(i)))
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return v
		}
		out := reflect.MakeMapWithSize(t, v.Len())
		for it := v.MapRange(); it.Next(); {
			out.SetMapIndex(it.Key(), emptyLists(it.Value()))
		}
		return out
	}
	return v
}
