package inventory

import (
	"testing"
)

// FuzzParseObjects feeds arbitrary YAML to the inventory file parser: no
// panic, and every object it accepts carries only valid identities.
func FuzzParseObjects(f *testing.F) {
	f.Add([]byte(goodInventory))
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("apiVersion: network.datumapis.com/v1alpha1\nkind: BGPAdvertisement\nmetadata: {name: 10-13}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := ParseObjects(data)
		if err != nil {
			return
		}
		for _, o := range objs {
			if o.Ref.Name == "" {
				t.Fatalf("accepted an object without a name: %+v", o)
			}
			for _, id := range o.Identities {
				if !id.Valid() {
					t.Fatalf("accepted invalid identity %v in %+v", id, o)
				}
			}
		}
	})
}
