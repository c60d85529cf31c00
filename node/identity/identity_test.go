package identity

import (
	"errors"
	"slices"
	"testing"
)

func TestTheIssueExampleFormatsAndParses(t *testing.T) {
	id := Identity{VPC: 62, Attachment: 65}
	if got := id.TapName(); got != "G000000010013H" {
		t.Fatalf("TapName = %q, want G000000010013H", got)
	}
	if got := id.VRFName(); got != "G000000010V" {
		t.Fatalf("VRFName = %q, want G000000010V", got)
	}
	if got := id.AdvertisementName(); got != "3e-41" {
		t.Fatalf("AdvertisementName = %q, want 3e-41", got)
	}
	parsed, err := ParseTapName("G000000010013H")
	if err != nil || parsed != id {
		t.Fatalf("ParseTapName = %v, %v; want %v", parsed, err, id)
	}
	vpc, err := ParseVRFName("G000000010V")
	if err != nil || vpc != 62 {
		t.Fatalf("ParseVRFName = %v, %v; want 62", vpc, err)
	}
}

func TestBase62AlphabetOrder(t *testing.T) {
	for _, tc := range []struct {
		s string
		n uint64
	}{{"0", 0}, {"9", 9}, {"a", 10}, {"z", 35}, {"A", 36}, {"Z", 61}, {"10", 62}, {"ZZZ", 238327}} {
		got, err := parseBase62(tc.s, 1<<63)
		if err != nil || got != tc.n {
			t.Errorf("parseBase62(%q) = %d, %v; want %d", tc.s, got, err, tc.n)
		}
		if f := formatBase62(tc.n, 0); f != tc.s {
			t.Errorf("formatBase62(%d) = %q; want %q", tc.n, f, tc.s)
		}
	}
}

func TestExtremeIdentitiesRoundTrip(t *testing.T) {
	for _, id := range []Identity{{1, 0}, {MaxVPC, MaxAttachment}, {62, 65}} {
		got, err := ParseTapName(id.TapName())
		if err != nil || got != id {
			t.Errorf("ParseTapName(%q) = %v, %v; want %v", id.TapName(), got, err, id)
		}
		ids, err := ParseAdvertisementName(id.AdvertisementName())
		if err != nil || !slices.Contains(ids, id) {
			t.Errorf("ParseAdvertisementName(%q) = %v, %v; want it to contain %v", id.AdvertisementName(), ids, err, id)
		}
		got, err = ParseBase62(id.VPC.Base62(), id.Attachment.Base62())
		if err != nil || got != id {
			t.Errorf("ParseBase62(%q, %q) = %v, %v", id.VPC.Base62(), id.Attachment.Base62(), got, err)
		}
	}
}

func TestMalformedNamesAreRefused(t *testing.T) {
	taps := []string{
		"", "G", "G000000010013", "X000000010013H", "G000000010013V", "G00000001001H",
		"G0000000100133H", // too long
		"G000000010-13H",  // not base62
		"G000000000013H",  // VPC 0 is reserved
		"GZZZZZZZZZ013H",  // VPC above 48 bits
		"G000000010ZZZH",  // attachment above 16 bits
		"g000000010013h",  // wrong case in the frame
		"G00000001\x00013H",
	}
	for _, name := range taps {
		id, err := ParseTapName(name)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseTapName(%q) = %v, %v; want ErrMalformed", name, id, err)
		}
		if err != nil && id != (Identity{}) {
			t.Errorf("ParseTapName(%q) returned %v with an error", name, id)
		}
	}
	for _, name := range []string{"", "G000000010", "G000000000V", "GZZZZZZZZZV", "G0000000100V"} {
		if _, err := ParseVRFName(name); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseVRFName(%q) err = %v; want ErrMalformed", name, err)
		}
	}
	for _, name := range []string{"", "3e", "-41", "3e-", "3e-41-1", "0-1", "3e-fffff", "!!-1", "10000000000000000-1"} {
		if ids, err := ParseAdvertisementName(name); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseAdvertisementName(%q) = %v, %v; want ErrMalformed", name, ids, err)
		}
	}
}

func TestAdvertisementNamesKeepEveryReading(t *testing.T) {
	for _, tc := range []struct {
		name string
		want []Identity
	}{
		// Current encoding, lower-case hex.
		{"3e-41", []Identity{{0x3e, 0x41}, {3*62 + 14, 4*62 + 1}}},
		// Valid in both encodings: both identities must be kept alive.
		{"10-13", []Identity{{16, 19}, {62, 65}}},
		// Only base62 (upper case or letters past f): an older object.
		{"10-1Z", []Identity{{62, 62 + 61}}},
		{"000000010-013", []Identity{{0x10, 0x13}, {62, 65}}},
		// Only hex: an attachment too large for base62's 16 bits.
		{"1-ffff", []Identity{{1, 0xffff}}},
	} {
		got, err := ParseAdvertisementName(tc.name)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseAdvertisementName(%q) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}
