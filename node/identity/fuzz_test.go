package identity

import (
	"slices"
	"testing"
)

// FuzzTenantName checks that any string either parses to a valid identity
// whose canonical name is the input, or is refused; and that any identity
// round-trips through every name form.
func FuzzTenantName(f *testing.F) {
	for _, s := range []string{"G000000010013H", "G000000000000H", "GZZZZZZZZZZZZH", "G000000010V", "3e-41", "10-13", ""} {
		f.Add(s, uint64(62), uint16(65))
	}
	f.Fuzz(func(t *testing.T, name string, vpc uint64, att uint16) {
		if id, err := ParseTapName(name); err == nil {
			if !id.Valid() || id.TapName() != name {
				t.Fatalf("ParseTapName(%q) = %v, which formats as %q", name, id, id.TapName())
			}
		}
		if v, err := ParseVRFName(name); err == nil && (!v.Valid() || v.VRFName() != name) {
			t.Fatalf("ParseVRFName(%q) = %v, which formats as %q", name, v, v.VRFName())
		}
		if ids, err := ParseAdvertisementName(name); err == nil {
			if len(ids) == 0 {
				t.Fatalf("ParseAdvertisementName(%q) returned no identity and no error", name)
			}
			for _, id := range ids {
				if !id.Valid() {
					t.Fatalf("ParseAdvertisementName(%q) returned invalid %v", name, id)
				}
			}
		}

		id := Identity{VPC: VPC(vpc), Attachment: Attachment(att)}
		if !id.Valid() {
			if _, err := ParseTapName(id.TapName()); err == nil {
				t.Fatalf("invalid %v formatted as %q, which parses", id, id.TapName())
			}
			return
		}
		if got, err := ParseTapName(id.TapName()); err != nil || got != id {
			t.Fatalf("tap name %q of %v parses as %v, %v", id.TapName(), id, got, err)
		}
		if got, err := ParseVRFName(id.VRFName()); err != nil || got != id.VPC {
			t.Fatalf("vrf name %q of %v parses as %v, %v", id.VRFName(), id, got, err)
		}
		if got, err := ParseAdvertisementName(id.AdvertisementName()); err != nil || !slices.Contains(got, id) {
			t.Fatalf("advertisement name %q of %v parses as %v, %v", id.AdvertisementName(), id, got, err)
		}
	})
}
