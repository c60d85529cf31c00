package reclaim

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/datum-cloud/galactic-node/node/identity"
)

// DecisionSweeper finds and clears the decisions rows (counters keyed by
// identity) that no registered interface names; *attachreg.Registry
// implements it. A Registry that does not implement it has none swept.
type DecisionSweeper interface {
	OrphanDecisions() ([]identity.Identity, error)
	ClearDecisions(id identity.Identity) (int, error)
}

// collectOrphanDecisions clears the decision counters of identities that no
// registered interface names: unregistering an interface clears them, but
// counters of a build that did not, or of a crash between an interface's
// rows and its counters, would stay until the map is full. Each identity is
// cleared under its VPC's VRF lock, after the registry checked again that no
// interface names it, so that it never races an ADD of that identity. A dry
// run clears nothing.
func (r *Reclaimer) collectOrphanDecisions(ctx context.Context, dryRun bool, rep *Report) {
	sw, ok := r.reg.(DecisionSweeper)
	if !ok {
		return
	}
	ids, err := sw.OrphanDecisions()
	if err != nil {
		rep.OrphanErrors = append(rep.OrphanErrors, err.Error())
		r.log.Warn("orphan decision counters not collected", "error", err)
		return
	}
	if len(ids) == 0 {
		return
	}
	if dryRun {
		r.log.Info("orphan decision counters would be cleared", "identities", len(ids))
		return
	}
	slices.SortFunc(ids, func(a, b identity.Identity) int {
		return cmp.Or(cmp.Compare(a.VPC, b.VPC), cmp.Compare(a.Attachment, b.Attachment))
	})
	for i := 0; i < len(ids); {
		vpc := ids[i].VPC
		j := i
		for j < len(ids) && ids[j].VPC == vpc {
			j++
		}
		r.clearDecisionsOfVPC(ctx, sw, vpc, ids[i:j], rep)
		i = j
	}
}

func (r *Reclaimer) clearDecisionsOfVPC(ctx context.Context, sw DecisionSweeper, vpc identity.VPC, ids []identity.Identity, rep *Report) {
	lctx, cancel := context.WithTimeout(ctx, r.cfg.LockTimeout)
	unlock, err := r.locks.Lock(lctx, vpc)
	cancel()
	if err != nil {
		rep.OrphanErrors = append(rep.OrphanErrors, fmt.Sprintf("clear decision counters of VPC %s: %v", vpc, err))
		return
	}
	defer unlock()
	for _, id := range ids {
		n, err := sw.ClearDecisions(id)
		if err != nil {
			rep.OrphanErrors = append(rep.OrphanErrors, err.Error())
		}
		if n == 0 {
			continue
		}
		r.log.Info("orphan decision counters cleared", "identity", id.String(), "rows", n)
		if r.obs != nil {
			r.obs.OrphanRowsCleared(MapDecisions, n)
		}
	}
}
