// Package inventory tells which tenant identities the cluster still claims:
// every (VPC, attachment) that a VPCAttachment carries in its status, or that
// a BGPAdvertisement of any node carries in its name.
//
// The rule a caller must know: only a Healthy snapshot may justify removing
// anything. A snapshot that is not synced, whose last read failed, or in which
// no VPCAttachment carries an identity (an empty cluster view is far more
// likely a broken read than a node with no tenants) says "keep everything".
package inventory

import (
	"context"
	"errors"
	"fmt"
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
	// one identity; Malformed lists objects whose identity fields are set
	// but do not parse (they carry nothing, and are reported).
	Attachments    int
	Advertisements int
	Malformed      []ObjectRef

	carriers map[identity.Identity][]ObjectRef
}

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

// Carriers returns the objects that carry id.
func (s *Snapshot) Carriers(id identity.Identity) []ObjectRef { return s.carriers[id] }

// Carried reports whether any object carries id.
func (s *Snapshot) Carried(id identity.Identity) bool { return len(s.carriers[id]) > 0 }

// Identities is the number of distinct identities carried.
func (s *Snapshot) Identities() int { return len(s.carriers) }

// Source produces snapshots. Snapshot must not block on the network: sources
// read from what they have already cached.
type Source interface {
	Snapshot(ctx context.Context) Snapshot
}

// Object is an inventory object trimmed to what the reclaim needs: its
// reference and the identities it carries.
type Object struct {
	Ref        ObjectRef
	Identities []identity.Identity
	Malformed  bool
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
		o.Malformed = true
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
		o.Malformed = true
		return o
	}
	o.Identities = ids
	return o
}

// build assembles a snapshot from trimmed objects.
func build(objects []Object, synced bool, readErr error) Snapshot {
	s := Snapshot{TakenAt: time.Now(), Synced: synced, Err: readErr, carriers: make(map[identity.Identity][]ObjectRef, len(objects))}
	for _, o := range objects {
		if o.Malformed {
			s.Malformed = append(s.Malformed, o.Ref)
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
	return s
}

// Static is a fixed snapshot source, for unit tests of logic above the
// inventory. It stands in for the cluster, not for a fault.
type Static struct {
	Objects []Object
	Synced  bool
	Err     error
}

// Snapshot implements Source.
func (s *Static) Snapshot(context.Context) Snapshot { return build(s.Objects, s.Synced, s.Err) }
