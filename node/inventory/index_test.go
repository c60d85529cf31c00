package inventory

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/datum-cloud/galactic-node/node/identity"
)

// SameSnapshot reports how a and b differ in what a pass reads from them
// (counts, malformed objects, every identity's carriers as a set), or "".
func SameSnapshot(a, b *Snapshot) string {
	if a.Attachments != b.Attachments || a.Advertisements != b.Advertisements || a.Identities() != b.Identities() {
		return fmt.Sprintf("counts %d/%d/%d vs %d/%d/%d", a.Attachments, a.Advertisements, a.Identities(), b.Attachments, b.Advertisements, b.Identities())
	}
	if a.MalformedAttachments != b.MalformedAttachments || a.MalformedAdvertisements != b.MalformedAdvertisements ||
		!slices.Equal(a.MalformedSample, b.MalformedSample) || !maps.Equal(a.MalformedWhy, b.MalformedWhy) {
		return fmt.Sprintf("malformed %d/%d %v vs %d/%d %v", a.MalformedAttachments, a.MalformedAdvertisements, a.MalformedSample,
			b.MalformedAttachments, b.MalformedAdvertisements, b.MalformedSample)
	}
	sorted := func(l []ObjectRef) []ObjectRef { return slices.SortedFunc(slices.Values(l), compareRefs) }
	n := 0
	for id, l := range a.All() {
		n++
		if got, want := sorted(l), sorted(b.Carriers(id)); !slices.Equal(got, want) {
			return fmt.Sprintf("%s carried by %v vs %v", id, got, want)
		}
	}
	if n != b.Identities() {
		return fmt.Sprintf("All yielded %d identities, %d carried", n, b.Identities())
	}
	return ""
}

// TestIndexMatchesNewSnapshot drives an Index through a seeded random run
// of adds, identity changes, malformed objects and deletes, long enough to
// fold its overlay several times, and checks after every step group that
// its snapshot reads as NewSnapshot's over the same objects, and that a
// snapshot taken earlier still reads as it did.
func TestIndexMatchesNewSnapshot(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 3))
	const refs = 6000
	held := map[ObjectRef]Object{}
	object := func() Object {
		i := rng.IntN(refs)
		// Few identities for many objects: lists of several carriers.
		id := identity.Identity{VPC: identity.VPC(1 + rng.IntN(150)), Attachment: identity.Attachment(rng.IntN(60))}
		switch {
		case i%3 == 0:
			return AdvertisementObject(fmt.Sprintf("node-%d", i%100), id.AdvertisementName())
		case rng.IntN(40) == 0:
			return AttachmentObject("ns", fmt.Sprintf("att-%d", i), "!bad", "1")
		case rng.IntN(10) == 0:
			return AttachmentObject("ns", fmt.Sprintf("att-%d", i), "", "")
		default:
			return AttachmentObject(fmt.Sprintf("ns-%d", i%7), fmt.Sprintf("att-%d", i), id.VPC.Base62(), id.Attachment.Base62())
		}
	}
	x := NewIndex()
	var old Snapshot
	var oldWant Snapshot
	for step := range 40000 {
		switch o := object(); {
		case rng.IntN(3) == 0:
			x.Delete(o.Ref)
			delete(held, o.Ref)
		default:
			x.Set(o)
			held[o.Ref] = o
		}
		if step%997 != 0 {
			continue
		}
		got := x.Snapshot(true, nil)
		want := NewSnapshot(slices.Collect(maps.Values(held)), true, nil)
		if diff := SameSnapshot(&got, &want); diff != "" {
			t.Fatalf("step %d: index vs NewSnapshot: %s", step, diff)
		}
		if step > 0 {
			if diff := SameSnapshot(&old, &oldWant); diff != "" {
				t.Fatalf("step %d: an earlier snapshot changed: %s", step, diff)
			}
		}
		old, oldWant = got, want
	}
}

// TestIndexSnapshotIsReusedWhileNothingChanges: a snapshot with nothing
// changed since the last shares its maps (no copy, no rebuild), and a
// rewrite of an object that leaves its identities alone changes nothing.
func TestIndexSnapshotIsReusedWhileNothingChanges(t *testing.T) {
	x := NewIndex()
	x.Set(AttachmentObject("ns", "a", "1", "2"))
	s1 := x.Snapshot(true, nil)
	x.Set(AttachmentObject("ns", "a", "1", "2"))
	s2 := x.Snapshot(true, nil)
	if fmt.Sprintf("%p %p", s1.carriers, s1.overlay) != fmt.Sprintf("%p %p", s2.carriers, s2.overlay) {
		t.Fatal("snapshot rebuilt with nothing changed")
	}
	x.Set(AttachmentObject("ns", "a", "1", "3"))
	s3 := x.Snapshot(true, nil)
	if s3.Carried(identity.Identity{VPC: 1, Attachment: 2}) || !s3.Carried(identity.Identity{VPC: 1, Attachment: 3}) {
		t.Fatal("identity change not shown")
	}
	if !s1.Carried(identity.Identity{VPC: 1, Attachment: 2}) {
		t.Fatal("an earlier snapshot changed")
	}
	x.Set(AttachmentObject("ns", "a", "x!", "3"))
	if s := x.Snapshot(true, nil); s.Malformed() != 1 || s.Carried(identity.Identity{VPC: 1, Attachment: 3}) {
		t.Fatalf("malformed object not shown: %+v", s)
	}
	// Its VPC reads, its attachment does not: it holds the VPC.
	x.Set(AttachmentObject("ns", "a", "5", "ZZZ"))
	if s := x.Snapshot(true, nil); s.Malformed() != 1 || !s.Carried(identity.Identity{VPC: 5, Attachment: 9}) || s.Carried(identity.Identity{VPC: 6, Attachment: 9}) {
		t.Fatalf("held VPC not shown: %+v", s)
	}
	x.Delete(ObjectRef{Kind: AttachmentKind, Namespace: "ns", Name: "a"})
	if s := x.Snapshot(true, nil); s.Malformed() != 0 || s.Identities() != 0 || s.Attachments != 0 {
		t.Fatalf("delete not shown: %+v", s)
	}
}
