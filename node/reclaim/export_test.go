package reclaim

import (
	"context"

	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/link/driver"
	"github.com/datum-cloud/galactic-node/node/teardown"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
)

// BrakeOffUnlessSet is brakeOffUnlessSet, for the external tests.
var BrakeOffUnlessSet = brakeOffUnlessSet

// BreakHeldCheck, BreakCarriedCheck and BreakRemoval are the deliberately
// broken variants the chaos suite must catch: every holder check off, every
// inventory check off, and no removal at all. They wrap the reclaimer's
// inputs, so the product carries no switch for them.
func (r *Reclaimer) BreakHeldCheck() {
	r.useLinks(unheldLinks{inner: r.links})
	r.useProber(blindProber{})
}

// blindProber claims every tap without asking the kernel: the probe off.
type blindProber struct{}

func (blindProber) Claim(context.Context, link.Tap) (*holder.Claim, error) {
	return &holder.Claim{}, nil
}
func (r *Reclaimer) BreakCarriedCheck() { r.inv = uncarriedInventory{r.inv} }
func (r *Reclaimer) BreakRemoval()      { r.cfg.DryRun = true }

// useLinks replaces the link layer the reclaimer and its remover use.
func (r *Reclaimer) useLinks(links Links) {
	r.links = links
	r.remover.Links = links
}

// useProber replaces the kernel probe the reclaimer's remover uses.
func (r *Reclaimer) useProber(p teardown.Prober) {
	r.cfg.Prober = p
	r.remover.Prober = p
}

// useRegistry replaces the registry the reclaimer and its remover use.
func (r *Reclaimer) useRegistry(reg Registry) {
	r.reg = reg
	r.remover.Registry = reg
}

// unheldLinks reports every tap as a multiqueue tap with no queue and
// carrier off: whatever holds it is never seen.
type unheldLinks struct{ inner Links }

func unheld(l link.Link) link.Link {
	if l.Kind != "tun" {
		return l
	}
	zero, off := uint32(0), false
	l.Carrier = &off
	l.Tun = &driver.Tun{Type: driver.TunTypeTap, MultiQueue: true, NumQueues: &zero, NumDisabledQueues: &zero}
	return l
}

func (u unheldLinks) Links(ctx context.Context) ([]link.Link, error) {
	links, err := u.inner.Links(ctx)
	for i := range links {
		links[i] = unheld(links[i])
	}
	return links, err
}

func (u unheldLinks) Verify(ctx context.Context, want link.Expect) (link.Link, error) {
	l, err := u.inner.Verify(ctx, want)
	return unheld(l), err
}

// uncarriedInventory keeps the snapshot's health and counts but carries no
// identity.
type uncarriedInventory struct{ inventory.Source }

func (u uncarriedInventory) Snapshot(ctx context.Context) inventory.Snapshot {
	s := u.Source.Snapshot(ctx)
	return inventory.Snapshot{TakenAt: s.TakenAt, Synced: s.Synced, Err: s.Err,
		Attachments: s.Attachments, Advertisements: s.Advertisements, MalformedAttachments: s.MalformedAttachments, MalformedAdvertisements: s.MalformedAdvertisements,
		MalformedSample: s.MalformedSample, MalformedWhy: s.MalformedWhy}
}

func (u unheldLinks) Set(ctx context.Context, index uint32, ch link.Change) error {
	return u.inner.Set(ctx, index, ch)
}

func (u unheldLinks) DeleteVerified(ctx context.Context, want link.Expect) error {
	return u.inner.DeleteVerified(ctx, want)
}

func (u unheldLinks) DeleteGroup(ctx context.Context, group uint32) error {
	return u.inner.DeleteGroup(ctx, group)
}
