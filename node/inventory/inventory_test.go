package inventory

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

func snapshotOf(objects ...Object) Snapshot {
	return (&Static{Synced: true, Objects: objects}).Snapshot(context.Background())
}

// wantMalformed checks that s is unhealthy because of exactly the objects in
// want (ref -> a fragment of what did not parse), each named in the error.
func wantMalformed(t *testing.T, s Snapshot, want map[string]string) {
	t.Helper()
	err := s.Healthy()
	if !errors.Is(err, ErrMalformedObject) {
		t.Fatalf("Healthy() = %v, want ErrMalformedObject", err)
	}
	if len(s.Malformed) != len(want) {
		t.Errorf("Malformed = %v, want %d objects", s.Malformed, len(want))
	}
	for ref, why := range want {
		if !strings.Contains(err.Error(), ref+": ") || !strings.Contains(err.Error(), why) {
			t.Errorf("Healthy() = %q, want it to name %s and %q", err, ref, why)
		}
	}
}

// A VPCAttachment whose identity fields are set but do not parse may be the
// one that carries a live tap: the read is as untrustworthy as a failed one.
func TestAMalformedAttachmentMakesTheSnapshotUnhealthy(t *testing.T) {
	good := AttachmentObject("a", "good", "1", "1")
	for name, tc := range map[string]struct {
		vpc, att, why string
	}{
		"17-character vpc":     {strings.Repeat("a", 17), "1", `vpc "aaaaaaaaaaaaaaaaa"`},
		"vpc with a space":     {" a", "1", `vpc " a"`},
		"attachment of space":  {"1", " a", `attachment " a"`},
		"attachment too large": {"1", "ZZZ", `attachment "ZZZ"`},
		"vpc 0":                {"0", "1", "reserved"},
	} {
		s := snapshotOf(good, AttachmentObject("a", "bad", tc.vpc, tc.att))
		t.Run(name, func(t *testing.T) {
			wantMalformed(t, s, map[string]string{"VPCAttachment a/bad": tc.why})
			if s.Attachments != 1 || s.Identities() != 1 {
				t.Errorf("attachments %d, identities %d: the malformed object must carry nothing", s.Attachments, s.Identities())
			}
		})
	}
}

func TestAMalformedAdvertisementNameMakesTheSnapshotUnhealthy(t *testing.T) {
	good := AttachmentObject("a", "good", "1", "1")
	for _, name := range []string{"no-dash-here", "nodash", "-1", "1-", "gg-!", strings.Repeat("z", 17) + "-1"} {
		t.Run(name, func(t *testing.T) {
			s := snapshotOf(good, AdvertisementObject("node-b", name), AdvertisementObject("node-b", "3e-42"))
			wantMalformed(t, s, map[string]string{"BGPAdvertisement node-b/" + name: fmt.Sprintf("advertisement name %q", name)})
			if s.Advertisements != 1 {
				t.Errorf("advertisements %d, want 1", s.Advertisements)
			}
		})
	}
}

func TestAWellFormedInventoryStaysHealthy(t *testing.T) {
	s := snapshotOf(
		AttachmentObject("a", "web-0", "10", "13"),
		AttachmentObject("a", "pending", "", ""),    // carries none yet
		AttachmentObject("a", "half-set", "10", ""), // carries none yet
		AdvertisementObject("node-b", "3e-42"),
		AdvertisementObject("node-b", "10-13"),
	)
	if err := s.Healthy(); err != nil || len(s.Malformed) != 0 {
		t.Fatalf("Healthy() = %v, malformed %v; want healthy", err, s.Malformed)
	}
}

// However many objects are malformed, the error names at most ten, so that
// it stays a readable line in a report or a log.
func TestTheMalformedErrorIsBounded(t *testing.T) {
	objs := []Object{AttachmentObject("a", "good", "1", "1")}
	for i := range 25 {
		objs = append(objs, AdvertisementObject("n", fmt.Sprintf("bad%02d", i)))
	}
	s := snapshotOf(objs...)
	err := s.Healthy()
	if !errors.Is(err, ErrMalformedObject) {
		t.Fatalf("Healthy() = %v, want ErrMalformedObject", err)
	}
	if n := strings.Count(err.Error(), "BGPAdvertisement n/"); n != 10 || !strings.Contains(err.Error(), "and 15 more") {
		t.Errorf("Healthy() = %q: names %d objects, want 10 and \"and 15 more\"", err, n)
	}
}

// The file source goes through the same rule: a malformed object in a file
// that parses is no reason to remove what it was meant to carry.
func TestAMalformedObjectInAFileMakesItUnhealthy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.yaml")
	write(t, path, goodInventory+"---\n"+attachmentDoc(AttachmentAPIVersion, AttachmentKind, "web-1", "tenant-a", `" a"`, "1"))
	s := NewFile(path).Snapshot(context.Background())
	wantMalformed(t, s, map[string]string{"VPCAttachment tenant-a/web-1": `vpc " a"`})
}
