package teardown

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
)

// Gone is an interface whose eBPF rows or TCX pin outlived its link: the
// tap was deleted by something other than this project (ip link del, a
// VMM), or a removal died between the link and its rows.
type Gone struct {
	Ifindex uint32
	// Identity is what its rows name; the zero identity when they name
	// none (no ifindex_vrf row), in which case no VRF lock is taken.
	Identity identity.Identity
}

// ClearGone clears the rows and pin of each ifindex whose link no longer
// exists, under the VRF lock of the identity its rows name, so that it never
// races an ADD registering rows. An ifindex that has a link again is kept,
// as is every target whose lock is not had in time. With dryRun it reports
// what it would clear and changes nothing.
func (rm *Remover) ClearGone(ctx context.Context, gone []Gone, dryRun bool) (cleared []Gone, kept []Gone, failed []error) {
	byVPC := map[identity.VPC][]Gone{}
	for _, g := range gone {
		byVPC[g.Identity.VPC] = append(byVPC[g.Identity.VPC], g)
	}
	for _, vpc := range slices.Sorted(maps.Keys(byVPC)) {
		unlock := func() {}
		if vpc != 0 {
			lctx, cancel := context.WithTimeout(ctx, rm.lockTimeout())
			u, err := rm.Locks.Lock(lctx, vpc)
			cancel()
			if err != nil {
				for _, g := range byVPC[vpc] {
					failed = append(failed, fmt.Errorf("clear rows of gone ifindex %d: %w", g.Ifindex, err))
				}
				continue
			}
			unlock = u
		}
		for _, g := range byVPC[vpc] {
			_, err := rm.Links.Verify(ctx, link.Expect{Index: g.Ifindex})
			switch {
			case errors.Is(err, link.ErrLinkGone):
			case err == nil || errors.Is(err, link.ErrLinkChanged):
				kept = append(kept, g) // the ifindex has a link: its rows are live
				continue
			default:
				failed = append(failed, fmt.Errorf("clear rows of gone ifindex %d: %w", g.Ifindex, err))
				continue
			}
			if !dryRun {
				if err := rm.Registry.UnregisterInterface(ctx, g.Ifindex); err != nil {
					failed = append(failed, fmt.Errorf("clear rows of gone ifindex %d: %w", g.Ifindex, err))
					continue
				}
				rm.log().Info("rows of a gone interface cleared", "ifindex", g.Ifindex, "identity", g.Identity.String())
			}
			cleared = append(cleared, g)
		}
		unlock()
	}
	return cleared, kept, failed
}

func (rm *Remover) lockTimeout() time.Duration {
	if rm.LockTimeout <= 0 {
		return 10 * time.Second
	}
	return rm.LockTimeout
}

func (rm *Remover) log() *slog.Logger {
	if rm.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return rm.Log
}
