package reclaim

import (
	"github.com/datum-cloud/galactic-node/node/reclaim/reclaimbreak"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// BrakeOffUnlessSet is brakeOffUnlessSet, for the external tests.
var BrakeOffUnlessSet = brakeOffUnlessSet

// BreakHeldCheck, BreakCarriedCheck and BreakRemoval are the deliberately
// broken variants the chaos suite must catch: every holder check off, every
// inventory check off, and no removal at all. They wrap the reclaimer's
// inputs (reclaimbreak), so the product carries no switch for them.
func (r *Reclaimer) BreakHeldCheck() {
	r.useLinks(reclaimbreak.UnheldLinks{Inner: r.links})
	r.useProber(reclaimbreak.BlindProber{})
}

func (r *Reclaimer) BreakCarriedCheck() { r.inv = reclaimbreak.Uncarried{Source: r.inv} }
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
