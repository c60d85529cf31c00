// Package inventory tells which tenant identities the cluster still claims:
// every (VPC, attachment) that a VPCAttachment carries in its status, or that
// a BGPAdvertisement of any node carries in its name.
//
// The rule a caller must know: only a Healthy snapshot may justify removing
// anything. A snapshot that is not synced, whose last read failed, or in
// which no VPCAttachment carries an identity (an empty cluster view is far
// more likely a broken read than a node with no tenants) says "keep
// everything".
//
// A malformed object (identity fields set but unparseable) blocks only what
// it could denote: when its VPC reads and its attachment does not, it holds
// every identity of that VPC (Carried says so); when not even its VPC reads,
// it denotes nothing and blocks nothing. A tenant's typo must not halt
// removals of every other tenant on every node, nor cost its own VPC a tap.
//
// This package holds the rule, the types and the sources that need no
// Kubernetes client (a fixed list, a YAML file); the API server's source is
// node/inventory/kubeinventory, so that the reclaim, which needs only what is
// here, links no client-go.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
)

// API groups, versions and kinds of the objects read.
const (
	AttachmentAPIVersion    = "cloud.datumapis.com/v1alpha1"
	AttachmentKind          = "VPCAttachment"
	AdvertisementAPIVersion = "network.datumapis.com/v1alpha1"
	AdvertisementKind       = "BGPAdvertisement"
)

// Sentinel reasons a snapshot is not healthy.
var (
	ErrNotSynced           = errors.New("inventory not synced")
	ErrNoAttachmentCarries = errors.New("no VPCAttachment carries an identity")
)

// maxReason bounds an Object's Reason: it quotes the field read, which in a
// file may be of any length.
const maxReason = 200

// ObjectRef names one object that carries an identity.
type ObjectRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (r ObjectRef) String() string { return r.Kind + " " + r.Namespace + "/" + r.Name }

// Snapshot is the set of live identities at one moment, and how far it can
// be trusted.
type Snapshot struct {
	TakenAt time.Time
	// Synced: every source has completed its initial read.
	Synced bool
	// Err is the last read error not yet followed by a successful read.
	Err error
	// Attachments and Advertisements count the objects that carry at least
	// one identity. MalformedAttachments and MalformedAdvertisements count
	// the objects whose identity fields are set but do not parse: those
	// carry no identity, and the ones whose VPC reads hold that VPC's
	// identities (Carried). MalformedSample names the first MaxNamed of
	// them in sorted order, so that a report names the same ones pass after
	// pass, and MalformedWhy says what did not parse in each one named: a
	// tenant makes as many as it likes, and a snapshot that listed them all
	// would cost every node their number again.
	Attachments             int
	Advertisements          int
	MalformedAttachments    int
	MalformedAdvertisements int
	MalformedSample         []ObjectRef
	MalformedWhy            map[ObjectRef]string

	// carriers maps each identity to the objects that carry it. overlay,
	// from an Index, holds the identities that changed since carriers was
	// built, and wins over it: an empty list there means none carries the
	// identity any more. identities counts the identities carried.
	carriers   map[identity.Identity][]ObjectRef
	overlay    map[identity.Identity][]ObjectRef
	identities int
	// held maps each VPC that malformed objects still name to them: every
	// identity of that VPC counts as carried by them.
	held map[identity.VPC][]ObjectRef
}

// Malformed is the number of malformed objects of every kind.
func (s *Snapshot) Malformed() int { return s.MalformedAttachments + s.MalformedAdvertisements }

// Healthy returns nil when the snapshot may justify a removal, or the reason
// it may not.
func (s *Snapshot) Healthy() error {
	switch {
	case s.Err != nil:
		return fmt.Errorf("inventory read failed: %w", s.Err)
	case !s.Synced:
		return ErrNotSynced
	case s.Attachments == 0:
		return ErrNoAttachmentCarries
	}
	return nil
}

// Carriers returns the objects that carry id, the malformed objects that
// hold its VPC last. The list may be shared: read it, never write it.
func (s *Snapshot) Carriers(id identity.Identity) []ObjectRef {
	l, ok := s.overlay[id]
	if !ok {
		l = s.carriers[id]
	}
	if h := s.held[id.VPC]; len(h) > 0 {
		return append(slices.Clip(l), h...)
	}
	return l
}

// MaxNamed bounds how many objects a view, a report or a log names where
// the list is the tenants' (the carriers of one identity, the holders of a
// VPC): they make as many as they like, so the rest go as a count.
const MaxNamed = 10

// Named returns at most MaxNamed of refs and how many there are in all.
func Named(refs []ObjectRef) (named []ObjectRef, total int) {
	return refs[:min(len(refs), MaxNamed):min(len(refs), MaxNamed)], len(refs)
}

// Holders returns the malformed objects that hold vpc: their VPC reads,
// their attachment does not.
func (s *Snapshot) Holders(vpc identity.VPC) []ObjectRef { return s.held[vpc] }

// Carried reports whether any object carries id, or holds its VPC.
func (s *Snapshot) Carried(id identity.Identity) bool {
	if len(s.held[id.VPC]) > 0 {
		return true
	}
	if l, ok := s.overlay[id]; ok {
		return len(l) > 0
	}
	return len(s.carriers[id]) > 0
}

// Identities is the number of distinct identities carried.
func (s *Snapshot) Identities() int { return s.identities }

// All yields every identity carried and its carriers, in no set order; the
// VPCs malformed objects hold are not identities, and Holders tells of them.
func (s *Snapshot) All() iter.Seq2[identity.Identity, []ObjectRef] {
	return func(yield func(identity.Identity, []ObjectRef) bool) {
		for id, l := range s.overlay {
			if len(l) > 0 && !yield(id, l) {
				return
			}
		}
		for id, l := range s.carriers {
			if _, changed := s.overlay[id]; !changed && !yield(id, l) {
				return
			}
		}
	}
}

// Source produces snapshots. Snapshot must not block on the network: sources
// read from what they have already cached.
type Source interface {
	Snapshot(ctx context.Context) Snapshot
}

// ErrNotProvenCurrent wraps every failure to show that a source is as new
// as its origin: no removal may rest on it.
var ErrNotProvenCurrent = errors.New("inventory not proven current")

// Proven is a source that reads an origin (the API server) which can
// change behind its back, and says how new its newest answer is.
type Proven interface {
	// ProvenAt is when the newest consistent read of the origin that
	// succeeded started (a Prove, an Ask, or a probe of the source's own).
	// A watch event proves nothing: a delayed one arrives looking fresh.
	ProvenAt() time.Time
}

// Prover is a Source whose origin can change behind its back (a cache of the
// API server), and which can prove what it serves is current.
type Prover interface {
	Source
	Proven
	// Prove reads the origin now, consistently, and returns what it holds.
	// An error wraps ErrNotProvenCurrent.
	Prove(ctx context.Context) (Snapshot, error)
}

// Asker is a Source that keeps no copy of the origin's objects: a pass asks
// it about the identities it needs, and it reads the origin then,
// consistently. Its Snapshot makes no request: it says how the origin
// answered its last read (Synced, Err, and the size the brake weighs), and
// carries the identities of no object.
type Asker interface {
	Source
	Proven
	// Ask reads the origin now, consistently, for every object that carries
	// one of ids, and for the origin's health and size. The snapshot it
	// returns answers Carried and Carriers for ids only, and is healthy by
	// the same rule as any other. An error wraps ErrNotProvenCurrent.
	Ask(ctx context.Context, ids []identity.Identity) (Snapshot, error)
}

// NewAskedSnapshot assembles an Asker's snapshot, taken now: objects are those
// that carry the identities asked about, carrying says whether any
// VPCAttachment carries an identity at all, and size is how many
// VPCAttachments the origin holds, the measure the brake's shrink rule
// weighs in place of the identities an inventory that sees every object
// counts.
func NewAskedSnapshot(objects []Object, carrying bool, size int) Snapshot {
	s := NewSnapshot(objects, true, nil)
	s.Attachments = 0
	if carrying {
		s.Attachments = max(size, 1)
	}
	s.identities = size
	return s
}

// Object is an inventory object trimmed to what the reclaim needs: its
// reference and the identities it carries.
type Object struct {
	Ref        ObjectRef
	Identities []identity.Identity
	Malformed  bool
	// Reason says what did not parse in a malformed object.
	Reason string
	// Holds lists the VPCs a malformed object still names (its VPC read,
	// its attachment did not): it holds every identity of each.
	Holds []identity.VPC
}

// malformed marks o as malformed because of err, a parse error.
func (o *Object) malformed(err error) {
	o.Malformed = true
	// ErrMalformed ends every such error and tells the reader nothing more.
	r := strings.TrimSuffix(err.Error(), ": "+identity.ErrMalformed.Error())
	if len(r) > maxReason {
		r = strings.ToValidUTF8(r[:maxReason], "") + "..."
	}
	o.Reason = r
}

// AttachmentObject derives the identity a VPCAttachment carries from its
// status.vpc and status.vpcAttachment. With either empty it carries none yet;
// set but unparseable, it is malformed.
func AttachmentObject(namespace, name, vpc, attachment string) Object {
	o := Object{Ref: ObjectRef{Kind: AttachmentKind, Namespace: namespace, Name: name}}
	if vpc == "" || attachment == "" {
		return o
	}
	id, err := identity.ParseBase62(vpc, attachment)
	if err != nil {
		o.malformed(err)
		if v, ok := identity.PartialBase62(vpc, attachment); ok {
			o.Holds = []identity.VPC{v}
		}
		return o
	}
	o.Identities = []identity.Identity{id}
	return o
}

// AdvertisementObject derives the identities a BGPAdvertisement carries from
// its name: every reading identity.ParseAdvertisementName allows.
func AdvertisementObject(namespace, name string) Object {
	o := Object{Ref: ObjectRef{Kind: AdvertisementKind, Namespace: namespace, Name: name}}
	ids, err := identity.ParseAdvertisementName(name)
	if err != nil {
		o.malformed(err)
		o.Holds = identity.PartialAdvertisementName(name)
		return o
	}
	o.Identities = ids
	return o
}

// NewSnapshot assembles a snapshot, taken now, from trimmed objects: synced
// says whether every source completed its initial read, and readErr is the
// last read error not yet followed by a successful read. Every source builds
// its snapshots here, so that each judges health by the same rule.
func NewSnapshot(objects []Object, synced bool, readErr error) Snapshot {
	s := Snapshot{TakenAt: time.Now(), Synced: synced, Err: readErr, carriers: make(map[identity.Identity][]ObjectRef, len(objects))}
	var why map[ObjectRef]string
	for _, o := range objects {
		if o.Malformed {
			if why == nil {
				why = make(map[ObjectRef]string)
			}
			why[o.Ref] = o.Reason
			s.countMalformed(o.Ref.Kind)
			s.hold(o.Ref, o.Holds)
			continue
		}
		if len(o.Identities) == 0 {
			continue
		}
		switch o.Ref.Kind {
		case AttachmentKind:
			s.Attachments++
		case AdvertisementKind:
			s.Advertisements++
		}
		for _, id := range o.Identities {
			s.carriers[id] = append(s.carriers[id], o.Ref)
		}
	}
	s.MalformedSample, s.MalformedWhy = sample(maps.Keys(why), func(ref ObjectRef) string { return why[ref] })
	s.sortHeld()
	s.identities = len(s.carriers)
	return s
}

// sortHeld sorts each VPC's holders, so that a view names the same ones
// first every time: the cluster lists objects in no stable order.
func (s *Snapshot) sortHeld() {
	for _, l := range s.held {
		slices.SortFunc(l, compareRefs)
	}
}

func (s *Snapshot) countMalformed(kind string) {
	switch kind {
	case AttachmentKind:
		s.MalformedAttachments++
	case AdvertisementKind:
		s.MalformedAdvertisements++
	}
}

// sample returns the first MaxNamed of refs in sorted order, and why for
// each: in one pass over refs, holding no more than it returns, since refs
// may be as many objects as tenants made.
func sample(refs iter.Seq[ObjectRef], why func(ObjectRef) string) ([]ObjectRef, map[ObjectRef]string) {
	first := make([]ObjectRef, 0, MaxNamed+1)
	for ref := range refs {
		if len(first) == MaxNamed && compareRefs(ref, first[MaxNamed-1]) >= 0 {
			continue
		}
		i, _ := slices.BinarySearchFunc(first, ref, compareRefs)
		first = slices.Insert(first, i, ref)
		if len(first) > MaxNamed {
			first = first[:MaxNamed]
		}
	}
	if len(first) == 0 {
		return nil, nil
	}
	named := make(map[ObjectRef]string, len(first))
	for _, ref := range first {
		named[ref] = why(ref)
	}
	return slices.Clip(first), named
}

// hold records that ref holds every identity of vpcs.
func (s *Snapshot) hold(ref ObjectRef, vpcs []identity.VPC) {
	for _, v := range vpcs {
		if s.held == nil {
			s.held = make(map[identity.VPC][]ObjectRef)
		}
		s.held[v] = append(s.held[v], ref)
	}
}

// Static is a fixed snapshot source, for unit tests of logic above the
// inventory. It stands in for the cluster, not for a fault.
type Static struct {
	Objects []Object
	Synced  bool
	Err     error
}

// Snapshot implements Source.
func (s *Static) Snapshot(context.Context) Snapshot { return NewSnapshot(s.Objects, s.Synced, s.Err) }
