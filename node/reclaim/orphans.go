package reclaim

import (
	"context"
	"time"

	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// RegisteredLister lists the interfaces the pinned maps and link pins hold
// anything of; *attachreg.Registry implements it. A Registry that does not
// implement it has no orphans collected.
type RegisteredLister interface {
	Registered() ([]attachreg.Registered, error)
}

// OrphanReport is an interface whose rows or pin outlived its link.
type OrphanReport struct {
	attachreg.Registered
	FirstSeen time.Time `json:"firstSeen"`
	Passes    int       `json:"passes"`
}

// orphan is an OrphanReport tracked across passes.
type orphan = OrphanReport

// collectOrphans finds rows and pins of ifindexes that have no link in this
// pass's dump, and clears those a previous pass found too, rechecking under
// the VRF lock that the link is still gone: rows of an interface that
// exists are never touched, and an ADD that registers rows after the dump
// was read is seen live by the next pass. Without record (a preview), no
// sighting is kept.
func (r *Reclaimer) collectOrphans(ctx context.Context, links []link.Link, dryRun, record bool, rep *Report) {
	lister, ok := r.reg.(RegisteredLister)
	if !ok {
		return
	}
	regs, err := lister.Registered()
	if err != nil {
		rep.OrphanErrors = append(rep.OrphanErrors, err.Error())
		r.log.Warn("orphan collection skipped", "error", err)
		return
	}
	live := make(map[uint32]bool, len(links))
	for _, l := range links {
		live[l.Index] = true
	}
	now := time.Now()
	r.mu.Lock()
	prev := r.orphans
	r.mu.Unlock()
	next := map[uint32]orphan{}
	var confirmed []teardown.Gone
	for _, g := range regs {
		if live[g.Ifindex] {
			continue
		}
		o := orphan{Registered: g, FirstSeen: now, Passes: 1}
		if p, ok := prev[g.Ifindex]; ok {
			o.FirstSeen, o.Passes = p.FirstSeen, p.Passes+1
			confirmed = append(confirmed, teardown.Gone{Ifindex: g.Ifindex, Identity: g.Identity})
		} else {
			r.log.Info("orphan eBPF rows found", "ifindex", g.Ifindex, "identity", g.Identity.String(), "rows", g.Rows, "pinned", g.Pinned)
		}
		next[g.Ifindex] = o
		rep.Orphans = append(rep.Orphans, o)
	}
	if len(confirmed) > 0 {
		cleared, kept, failed := r.remover.ClearGone(ctx, confirmed, dryRun)
		for _, g := range kept {
			delete(next, g.Ifindex)
		}
		for _, g := range cleared {
			o := next[g.Ifindex]
			if dryRun {
				rep.OrphansWouldClear = append(rep.OrphansWouldClear, o)
				continue
			}
			delete(next, g.Ifindex)
			rep.OrphansCleared = append(rep.OrphansCleared, o)
			if r.obs != nil {
				for m, n := range o.Rows {
					r.obs.OrphanRowsCleared(m, n)
				}
				if o.Pinned {
					r.obs.OrphanRowsCleared(MapTCXLink, 1)
				}
			}
		}
		for _, err := range failed {
			rep.OrphanErrors = append(rep.OrphanErrors, err.Error())
		}
	}
	// A preview's sightings must not bring a clearing closer, as its
	// sightings of taps (PassOptions.DryRun).
	if record {
		r.mu.Lock()
		r.orphans = next
		r.mu.Unlock()
	}
	r.collectOrphanDecisions(ctx, dryRun, rep)
}
