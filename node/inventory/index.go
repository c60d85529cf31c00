package inventory

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"
	"unique"

	"github.com/datum-cloud/galactic-node/node/identity"
)

// compactMin and compactShare bound an Index's overlay: it is folded into a
// new base once it holds more than compactMin identities and more than one
// base identity in compactShare. Folding copies the base, so it runs at most
// once per len(base)/compactShare changes, and a snapshot copies at most
// that many overlay entries.
const (
	compactMin   = 4096
	compactShare = 4
)

// Index is the identity → carriers map of a changing set of objects, kept up
// to date one object at a time, for a source that follows changes (the
// cluster's watches) rather than rereading everything: NewSnapshot over
// 100,000 objects takes about 65 ms, an Index's Snapshot takes none while
// nothing changed and copies only what changed since its last fold
// otherwise.
//
// It also holds the objects themselves, so that it can serve as the store
// of a watch: then no snapshot can miss an object the store holds, since
// they are one and the same.
//
// Snapshots share the Index's maps, which it never writes once shared: the
// base map is replaced, never written, and carrier lists are copied on
// every change.
type Index struct {
	mu      sync.Mutex
	objects map[ObjectRef][]identity.Identity // every object held, carrying or not
	// why holds the malformed objects, and what did not parse in each,
	// interned: a tenant's thousands of objects written by one broken
	// template share one reason, and a handle is half a string header.
	why   map[ObjectRef]unique.Handle[string]
	holds map[ObjectRef][]identity.VPC // the malformed ones that still name VPCs

	base  map[identity.Identity][]ObjectRef // frozen once built; shared with snapshots
	delta map[identity.Identity][]ObjectRef // changed since base; empty list: uncarried now

	identities, attachments, advertisements int

	version   uint64 // bumped by every change that a snapshot shows
	snap      *Snapshot
	snapAt    uint64 // version snap was built at
	badAt     uint64 // version the malformed set last changed at
	badSnapAt uint64 // version snap's malformed counts and sample were built at
}

// NewIndex returns an empty Index.
func NewIndex() *Index {
	return &Index{
		objects: make(map[ObjectRef][]identity.Identity),
		why:     make(map[ObjectRef]unique.Handle[string]),
		holds:   make(map[ObjectRef][]identity.VPC),
		base:    make(map[identity.Identity][]ObjectRef),
		delta:   make(map[identity.Identity][]ObjectRef),
	}
}

// Set adds o, or replaces the object with o's reference.
func (x *Index) Set(o Object) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.objects[o.Ref]; ok && slices.Equal(old, o.Identities) {
		why, bad := x.why[o.Ref]
		if bad == o.Malformed && (!bad || why.Value() == o.Reason) && slices.Equal(x.holds[o.Ref], o.Holds) {
			// A relist or a status write that left the identity alone:
			// nothing a snapshot shows changed.
			return
		}
	}
	x.remove(o.Ref)
	x.add(o)
	x.version++
	x.compact()
}

// Delete removes the object ref, if held.
func (x *Index) Delete(ref ObjectRef) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.objects[ref]; !ok {
		return
	}
	x.remove(ref)
	x.version++
	x.compact()
}

// Get returns the object ref as held.
func (x *Index) Get(ref ObjectRef) (Object, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ids, ok := x.objects[ref]
	if !ok {
		return Object{}, false
	}
	o := Object{Ref: ref, Identities: slices.Clone(ids), Holds: slices.Clone(x.holds[ref])}
	if why, bad := x.why[ref]; bad {
		o.Malformed, o.Reason = true, why.Value()
	}
	return o, true
}

// Refs lists the objects of kind held.
func (x *Index) Refs(kind string) []ObjectRef {
	x.mu.Lock()
	defer x.mu.Unlock()
	var refs []ObjectRef
	for ref := range x.objects {
		if ref.Kind == kind {
			refs = append(refs, ref)
		}
	}
	return refs
}

// Snapshot returns what the Index holds now as a snapshot, with synced and
// readErr as in NewSnapshot. While nothing changed it returns the last one
// built.
func (x *Index) Snapshot(synced bool, readErr error) Snapshot {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.snap == nil || x.snapAt != x.version {
		s := Snapshot{
			Attachments:    x.attachments,
			Advertisements: x.advertisements,
			carriers:       x.base,
			overlay:        maps.Clone(x.delta),
			identities:     x.identities,
		}
		if x.snap != nil && x.badSnapAt == x.badAt {
			s.MalformedAttachments, s.MalformedAdvertisements = x.snap.MalformedAttachments, x.snap.MalformedAdvertisements
			s.MalformedSample, s.MalformedWhy, s.held = x.snap.MalformedSample, x.snap.MalformedWhy, x.snap.held
		} else if len(x.why) > 0 {
			for ref := range x.why {
				s.countMalformed(ref.Kind)
			}
			s.MalformedSample, s.MalformedWhy = sample(maps.Keys(x.why), func(ref ObjectRef) string { return x.why[ref].Value() })
			for ref, vpcs := range x.holds {
				s.hold(ref, vpcs)
			}
			s.sortHeld()
		}
		x.snap, x.snapAt, x.badSnapAt = &s, x.version, x.badAt
	}
	s := *x.snap
	s.TakenAt, s.Synced, s.Err = time.Now(), synced, readErr
	return s
}

func compareRefs(a, b ObjectRef) int {
	return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// add counts o in as NewSnapshot would; o.Ref is not held.
func (x *Index) add(o Object) {
	if o.Malformed {
		// A malformed object carries nothing, as in NewSnapshot.
		x.objects[o.Ref] = nil
		x.why[o.Ref] = unique.Make(o.Reason)
		if len(o.Holds) > 0 {
			x.holds[o.Ref] = slices.Clone(o.Holds)
		}
		x.badAt = x.version + 1
		return
	}
	x.objects[o.Ref] = slices.Clip(slices.Clone(o.Identities))
	if len(o.Identities) == 0 {
		return
	}
	x.count(o.Ref.Kind, 1)
	for _, id := range o.Identities {
		old := x.carriersOf(id)
		// A new list every time: the old one may be in a snapshot.
		x.setCarriers(id, old, append(slices.Clip(old), o.Ref))
	}
}

// remove takes ref out, if held.
func (x *Index) remove(ref ObjectRef) {
	ids, ok := x.objects[ref]
	if !ok {
		return
	}
	delete(x.objects, ref)
	if _, bad := x.why[ref]; bad {
		delete(x.why, ref)
		delete(x.holds, ref)
		x.badAt = x.version + 1
	}
	if len(ids) == 0 {
		return
	}
	x.count(ref.Kind, -1)
	for _, id := range ids {
		old := x.carriersOf(id)
		if !slices.Contains(old, ref) {
			continue // a second reading of the same identity, already done
		}
		x.setCarriers(id, old, slices.DeleteFunc(slices.Clone(old), func(r ObjectRef) bool { return r == ref }))
	}
}

func (x *Index) count(kind string, n int) {
	switch kind {
	case AttachmentKind:
		x.attachments += n
	case AdvertisementKind:
		x.advertisements += n
	}
}

func (x *Index) carriersOf(id identity.Identity) []ObjectRef {
	if l, ok := x.delta[id]; ok {
		return l
	}
	return x.base[id]
}

func (x *Index) setCarriers(id identity.Identity, old, now []ObjectRef) {
	switch {
	case len(old) == 0 && len(now) > 0:
		x.identities++
	case len(old) > 0 && len(now) == 0:
		x.identities--
		now = nil
	}
	x.delta[id] = now
}

// compact folds the overlay into a new base once it has grown past its
// bound. The old base stays as it was for the snapshots that hold it.
func (x *Index) compact() {
	if len(x.delta) <= compactMin || len(x.delta) <= len(x.base)/compactShare {
		return
	}
	base := maps.Clone(x.base)
	for id, l := range x.delta {
		if len(l) == 0 {
			delete(base, id)
		} else {
			base[id] = l
		}
	}
	x.base, x.delta = base, make(map[identity.Identity][]ObjectRef)
}
