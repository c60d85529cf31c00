package attachreg

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/identity"
)

// Decision counters are keyed by identity, not by interface: they go when the
// last interface registered with their identity goes (UnregisterInterface),
// and the orphan collection clears those that no interface names any more
// (OrphanDecisions, ClearDecisions), so that a re-created identity counts
// from zero and the map does not fill with the counters of gone tenants.

// decisions are every decision the program counts.
var decisions = []datapath.Decision{datapath.DecisionAllow, datapath.DecisionDeny, datapath.DecisionHostOnly,
	datapath.DecisionMalformed, datapath.DecisionSpoofed}

// boundIdentity returns the identity ifindex's ifindex_vrf row names, and
// whether it has one.
func (r *Registry) boundIdentity(ifindex uint32) (identity.Identity, bool, error) {
	b, err := r.dp.IfindexVRF.Get(ifindex)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return identity.Identity{}, false, nil
	}
	if err != nil {
		return identity.Identity{}, false, err
	}
	return IdentityOf(b.VPC, b.Attachment), true, nil
}

// registeredIdentities returns the identities named by ifindex_vrf rows of
// interfaces other than except (0: none excepted).
func (r *Registry) registeredIdentities(except uint32) (map[identity.Identity]bool, error) {
	rows, err := r.dp.IfindexVRF.Dump(0)
	if err != nil {
		return nil, err
	}
	ids := make(map[identity.Identity]bool, len(rows))
	for _, row := range rows {
		if row.Key != except {
			ids[IdentityOf(row.Value.VPC, row.Value.Attachment)] = true
		}
	}
	return ids, nil
}

// clearDecisions removes id's decisions rows unless an interface other than
// except is registered with id, and returns how many it removed.
func (r *Registry) clearDecisions(id identity.Identity, except uint32) (int, error) {
	ids, err := r.registeredIdentities(except)
	if err != nil {
		return 0, fmt.Errorf("clear decisions of %v: %w", id, err)
	}
	if ids[id] {
		return 0, nil
	}
	removed := 0
	var errs []error
	for _, d := range decisions {
		err := r.dp.Decisions.Delete(DecisionKey(id, d))
		switch {
		case err == nil:
			removed++
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("clear decisions of %v: %w", id, err)
	}
	return removed, nil
}

// clearDecisionsOf is UnregisterInterface's step: once ifindex's rows are
// gone (the policy first, so the program no longer counts for it), the
// counters of the identity it was registered with go too, unless another
// interface of that identity remains.
func (r *Registry) clearDecisionsOf(ifindex uint32, id identity.Identity, bound bool) error {
	if !bound {
		return nil
	}
	n, err := r.clearDecisions(id, ifindex)
	if n > 0 {
		r.log.Info("decision counters cleared", "identity", id.String(), "rows", n)
	}
	return err
}

// OrphanDecisions returns the identities that have decisions rows but that
// no ifindex_vrf row names: the input of the orphan collection's sweep.
func (r *Registry) OrphanDecisions() ([]identity.Identity, error) {
	ids, err := r.registeredIdentities(0)
	if err != nil {
		return nil, fmt.Errorf("orphan decisions: map %s: %w", r.dp.IfindexVRF.Name(), err)
	}
	rows, err := r.dp.Decisions.Dump(0)
	if err != nil {
		return nil, fmt.Errorf("orphan decisions: map %s: %w", r.dp.Decisions.Name(), err)
	}
	seen := map[identity.Identity]bool{}
	var out []identity.Identity
	for _, row := range rows {
		id := IdentityOf(row.Key.VPC, row.Key.Attachment)
		if !ids[id] && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

// ClearDecisions removes id's decisions rows unless an interface is
// registered with id, and returns how many it removed. The caller holds the
// VRF lock of id's VPC, so that no ADD of id registers meanwhile.
func (r *Registry) ClearDecisions(id identity.Identity) (int, error) {
	return r.clearDecisions(id, 0)
}
