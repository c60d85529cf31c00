package inventory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/node/identity"
)

func snapshotOf(objects ...Object) Snapshot {
	return (&Static{Synced: true, Objects: objects}).Snapshot(context.Background())
}

// wantMalformed checks that s lists exactly the objects in want (ref -> a
// fragment of what did not parse) as malformed, and stays healthy: a
// malformed object blocks only what it could denote, never every removal.
func wantMalformed(t *testing.T, s Snapshot, want map[string]string) {
	t.Helper()
	if err := s.Healthy(); err != nil {
		t.Fatalf("Healthy() = %v: one malformed object must not halt every removal", err)
	}
	if s.Malformed() != len(want) || len(s.MalformedSample) != min(len(want), MaxNamed) {
		t.Errorf("%d malformed, sample %v; want %d objects", s.Malformed(), s.MalformedSample, len(want))
	}
	for _, ref := range s.MalformedSample {
		why, ok := want[ref.String()]
		if !ok || !strings.Contains(s.MalformedWhy[ref], why) {
			t.Errorf("%s: why %q, want %q", ref, s.MalformedWhy[ref], why)
		}
	}
}

// A VPCAttachment whose identity fields are set but do not parse carries no
// identity. Whose VPC reads holds that VPC's every identity, since it may be
// meant to carry any of them; whose VPC does not read denotes none.
func TestAMalformedAttachmentHoldsOnlyWhatItCouldDenote(t *testing.T) {
	good := AttachmentObject("a", "good", "1", "1")
	other := identity.Identity{VPC: 2, Attachment: 7}
	for name, tc := range map[string]struct {
		vpc, att, why string
		holds         identity.VPC // 0: none
	}{
		"17-character vpc":     {strings.Repeat("a", 17), "1", `vpc "aaaaaaaaaaaaaaaaa"`, 0},
		"vpc with a space":     {" a", "1", `vpc " a"`, 0},
		"attachment of space":  {"1", " a", `attachment " a"`, 1},
		"attachment too large": {"1", "ZZZ", `attachment "ZZZ"`, 1},
		"vpc 0":                {"0", "1", "reserved", 0},
	} {
		s := snapshotOf(good, AttachmentObject("a", "bad", tc.vpc, tc.att))
		t.Run(name, func(t *testing.T) {
			wantMalformed(t, s, map[string]string{"VPCAttachment a/bad": tc.why})
			if s.Attachments != 1 || s.Identities() != 1 {
				t.Errorf("attachments %d, identities %d: the malformed object must carry nothing", s.Attachments, s.Identities())
			}
			if s.Carried(other) {
				t.Errorf("%s of another VPC is carried: the malformed object blocks it", other)
			}
			held := identity.Identity{VPC: 1, Attachment: 999}
			if got := s.Carried(held); got != (tc.holds == 1) {
				t.Errorf("Carried(%s) = %v, want %v", held, got, tc.holds == 1)
			}
		})
	}
}

func TestAMalformedAdvertisementNameHoldsOnlyWhatItCouldDenote(t *testing.T) {
	good := AttachmentObject("a", "good", "1", "1")
	for name, holds := range map[string][]identity.VPC{
		"no-dash-here": nil, "nodash": nil, "-1": nil, "1-": nil,
		strings.Repeat("z", 17) + "-1": nil,
		// The VPC reads in hex (0xab) and in base62 ("ab"), the attachment in
		// neither: both VPCs are held.
		"ab-zzzzzz": {0xab, 10*62 + 11},
	} {
		t.Run(name, func(t *testing.T) {
			s := snapshotOf(good, AdvertisementObject("node-b", name), AdvertisementObject("node-b", "3e-42"))
			wantMalformed(t, s, map[string]string{"BGPAdvertisement node-b/" + name: fmt.Sprintf("advertisement name %q", name)})
			if s.Advertisements != 1 {
				t.Errorf("advertisements %d, want 1", s.Advertisements)
			}
			for _, v := range holds {
				if id := (identity.Identity{VPC: v, Attachment: 5}); !s.Carried(id) || !slices.Contains(s.Carriers(id), ObjectRef{AdvertisementKind, "node-b", name}) {
					t.Errorf("%s not held by %s: carriers %v", id, name, s.Carriers(id))
				}
			}
			if id := (identity.Identity{VPC: 77, Attachment: 5}); s.Carried(id) {
				t.Errorf("%s carried by %v", id, s.Carriers(id))
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
	if err := s.Healthy(); err != nil || s.Malformed() != 0 {
		t.Fatalf("Healthy() = %v, malformed %d; want healthy", err, s.Malformed())
	}
}

// The file source goes through the same rule: a malformed object in a file
// that parses is listed, and blocks only what it could denote.
func TestAMalformedObjectInAFileIsListed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.yaml")
	write(t, path, goodInventory+"---\n"+attachmentDoc(AttachmentAPIVersion, AttachmentKind, "web-1", "tenant-a", `" a"`, "1"))
	s := NewFile(path).Snapshot(context.Background())
	wantMalformed(t, s, map[string]string{"VPCAttachment tenant-a/web-1": `vpc " a"`})
}

// A snapshot counts every malformed object but names at most MaxNamed, the
// first in sorted order whatever order they came in, with what did not
// parse in each: a tenant makes as many as it likes, and every node would
// hold them all again in each snapshot. An Index fed the same objects, in
// another order, counts and names the same, and names the next one when a
// named one goes.
func TestManyMalformedObjectsAreCountedAndSampled(t *testing.T) {
	var objects []Object
	for i := range 25 {
		objects = append(objects, AttachmentObject("tenant-m", fmt.Sprintf("att-%02d", i), "0", "1"))
	}
	for i := range 5 {
		objects = append(objects, AdvertisementObject("tenant-m", fmt.Sprintf("not-an-ad-%d", i)))
	}
	shuffled := slices.Clone(objects)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	s := snapshotOf(shuffled...)

	// BGPAdvertisement sorts before VPCAttachment.
	var want []ObjectRef
	for _, o := range append(objects[25:], objects[:5]...) {
		want = append(want, o.Ref)
	}
	if s.MalformedAttachments != 25 || s.MalformedAdvertisements != 5 || s.Malformed() != 30 || !slices.Equal(s.MalformedSample, want) {
		t.Fatalf("malformed %d/%d (%d), sample %v; want 25/5 (30) and %v", s.MalformedAttachments, s.MalformedAdvertisements, s.Malformed(), s.MalformedSample, want)
	}
	if len(s.MalformedWhy) != MaxNamed || !strings.Contains(s.MalformedWhy[want[9]], "reserved") {
		t.Errorf("why %v: want the %d named, each with its reason", s.MalformedWhy, MaxNamed)
	}

	x := NewIndex()
	for _, o := range shuffled {
		x.Set(o)
	}
	if is := x.Snapshot(true, nil); SameSnapshot(&s, &is) != "" {
		t.Errorf("the Index differs from NewSnapshot: %s", SameSnapshot(&s, &is))
	}
	x.Delete(want[0])
	is := x.Snapshot(true, nil)
	if next := append(slices.Clone(want[1:]), objects[5].Ref); is.Malformed() != 29 || !slices.Equal(is.MalformedSample, next) {
		t.Errorf("after deleting %s: %d malformed, sample %v; want 29 and %v", want[0], is.Malformed(), is.MalformedSample, next)
	}
}
