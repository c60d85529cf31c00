// Package reclaimbreak wraps the reclaim's inputs so that one safety rule
// is broken on purpose: the variants the chaos and robustness suites must
// catch. Only tests import it, and the daemon's galactic_testhooks build;
// test/layout checks that no product binary links it.
package reclaimbreak

import (
	"context"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/link/driver"
	"github.com/datum-cloud/galactic-node/node/teardown"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
)

// UnheldLinks reports every tap as a multiqueue tap with no queue and
// carrier off: whatever holds it is never seen.
type UnheldLinks struct{ Inner teardown.Links }

func unheld(l link.Link) link.Link {
	if l.Kind != "tun" {
		return l
	}
	zero, off := uint32(0), false
	l.Carrier = &off
	l.Tun = &driver.Tun{Type: driver.TunTypeTap, MultiQueue: true, NumQueues: &zero, NumDisabledQueues: &zero}
	return l
}

func (u UnheldLinks) Links(ctx context.Context) ([]link.Link, error) {
	links, err := u.Inner.Links(ctx)
	for i := range links {
		links[i] = unheld(links[i])
	}
	return links, err
}

func (u UnheldLinks) Verify(ctx context.Context, want link.Expect) (link.Link, error) {
	l, err := u.Inner.Verify(ctx, want)
	return unheld(l), err
}

func (u UnheldLinks) Set(ctx context.Context, index uint32, ch link.Change) error {
	return u.Inner.Set(ctx, index, ch)
}

func (u UnheldLinks) DeleteVerified(ctx context.Context, want link.Expect) error {
	return u.Inner.DeleteVerified(ctx, want)
}

func (u UnheldLinks) DeleteGroup(ctx context.Context, group uint32) error {
	return u.Inner.DeleteGroup(ctx, group)
}

// BlindProber claims every tap without asking the kernel: the probe off.
type BlindProber struct{}

func (BlindProber) Claim(context.Context, link.Tap) (*holder.Claim, error) {
	return &holder.Claim{}, nil
}

// Forget returns s with its health and counts, and no identity carried.
func Forget(s inventory.Snapshot) inventory.Snapshot {
	return inventory.Snapshot{TakenAt: s.TakenAt, Synced: s.Synced, Err: s.Err,
		Attachments: s.Attachments, Advertisements: s.Advertisements,
		MalformedAttachments: s.MalformedAttachments, MalformedAdvertisements: s.MalformedAdvertisements,
		MalformedSample: s.MalformedSample, MalformedWhy: s.MalformedWhy}
}

// Uncarried is a source whose snapshots carry no identity.
type Uncarried struct{ inventory.Source }

func (u Uncarried) Snapshot(ctx context.Context) inventory.Snapshot {
	return Forget(u.Source.Snapshot(ctx))
}

// UncarriedAsker asks the cluster as the daemon does, then forgets which
// identities the answer carries: every pass still runs, and every unheld
// tap looks stale.
type UncarriedAsker struct{ inventory.Asker }

func (u UncarriedAsker) Snapshot(ctx context.Context) inventory.Snapshot {
	return Forget(u.Asker.Snapshot(ctx))
}

func (u UncarriedAsker) Ask(ctx context.Context, ids []identity.Identity) (inventory.Snapshot, error) {
	s, err := u.Asker.Ask(ctx, ids)
	return Forget(s), err
}
