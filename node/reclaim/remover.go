package reclaim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
)

// Target is a tap chosen for removal, as it was read when chosen.
type Target struct {
	Expect   link.Expect
	Identity identity.Identity
}

// Outcome is what Remove did with each target.
type Outcome struct {
	Reclaimed    []TapRef
	WouldReclaim []TapRef
	Kept         []Kept
	Failed       []Failure
}

// Recheck is called under the VRF locks, after the links were read again,
// and returns a function telling why a target must now be kept (empty: it
// may go). An error keeps every target.
type Recheck func(ctx context.Context) (func(Target) string, error)

// Remover removes tenant taps with the reclaim's checks, for the reclaim
// and for CNI GC alike: under the VRF locks of the targets (taken in VPC
// order, waiting at most LockTimeout), each link is read again and must have
// the same name and owner stamp and not be held; then recheck; then its rows
// go through the registry, and the survivors are deleted as one link group
// after checking that the group holds exactly them.
type Remover struct {
	Links       Links
	Registry    Registry
	Locks       Locker
	LockTimeout time.Duration
	Log         *slog.Logger
	// AfterRows, when set, runs after the rows of the batch are cleared and
	// before any link is touched: a test seam (see Config.AfterRows).
	AfterRows func()

	// ignoreHeld switches the holder recheck off: a deliberately broken
	// variant for the chaos suite to catch, set only by tests.
	ignoreHeld bool
}

// Remove removes what passes every check; dump is a recent link dump, used
// to choose a free link group. With dryRun it reports what it would remove.
func (rm *Remover) Remove(ctx context.Context, targets []Target, dump []link.Link, recheck Recheck, dryRun bool) Outcome {
	var out Outcome
	if rm.Log == nil {
		rm.Log = slog.New(slog.DiscardHandler)
	}
	byVPC := map[identity.VPC][]Target{}
	for _, t := range targets {
		byVPC[t.Identity.VPC] = append(byVPC[t.Identity.VPC], t)
	}
	timeout := rm.LockTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	lockCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var locked []Target
	var unlocks []func()
	defer func() {
		for i := len(unlocks) - 1; i >= 0; i-- {
			unlocks[i]()
		}
	}()
	for _, vpc := range slices.Sorted(maps.Keys(byVPC)) {
		unlock, err := rm.Locks.Lock(lockCtx, vpc)
		if err != nil {
			for _, t := range byVPC[vpc] {
				out.fail(rm.Log, t, StageLock, err)
			}
			continue
		}
		unlocks = append(unlocks, unlock)
		locked = append(locked, byVPC[vpc]...)
	}

	var verified []Target
	for _, t := range locked {
		if why, err := rm.recheckLink(ctx, t); err != nil {
			out.fail(rm.Log, t, StageVerify, err)
		} else if why != "" {
			out.keep(rm.Log, t, why)
		} else {
			verified = append(verified, t)
		}
	}
	if len(verified) == 0 {
		return out
	}
	keepWhy, err := recheck(ctx)
	if err != nil {
		for _, t := range verified {
			out.keep(rm.Log, t, err.Error())
		}
		return out
	}
	var batch []Target
	for _, t := range verified {
		if why := keepWhy(t); why != "" {
			out.keep(rm.Log, t, why)
			continue
		}
		if dryRun {
			out.WouldReclaim = append(out.WouldReclaim, tapRefOf(t))
			continue
		}
		if err := rm.Registry.UnregisterInterface(ctx, t.Expect.Index); err != nil {
			out.fail(rm.Log, t, StageRows, err)
			continue
		}
		batch = append(batch, t)
	}
	if len(batch) > 0 {
		if rm.AfterRows != nil {
			rm.AfterRows()
		}
		rm.deleteBatch(ctx, batch, dump, &out)
	}
	return out
}

// recheckLink reads the link again: it returns why the tap must be kept, or
// an error when the read itself failed.
func (rm *Remover) recheckLink(ctx context.Context, t Target) (string, error) {
	l, err := rm.Links.Verify(ctx, t.Expect)
	switch {
	case errors.Is(err, link.ErrLinkGone):
		return "gone before removal", nil
	case errors.Is(err, link.ErrLinkChanged):
		return err.Error(), nil
	case err != nil:
		return "", err
	}
	tap, ok := l.AsTap()
	if !ok {
		return "no longer reads as a tenant tap", nil
	}
	if tap.Held() && !rm.ignoreHeld {
		return "held at recheck", nil
	}
	return "", nil
}

// deleteBatch moves the verified taps into a link group reserved for this
// batch, checks that the group holds exactly them, none held, and deletes the
// group in one request: the kernel then unregisters them in one batch.
func (rm *Remover) deleteBatch(ctx context.Context, batch []Target, dump []link.Link, out *Outcome) {
	group := reserveGroup(dump)
	var grouped []Target
	for _, t := range batch {
		if err := rm.Links.Set(ctx, t.Expect.Index, link.Change{Group: &group}); err != nil {
			out.fail(rm.Log, t, StageLink, fmt.Errorf("move to link group %#x: %w", group, err))
			continue
		}
		grouped = append(grouped, t)
	}
	if len(grouped) == 0 {
		return
	}
	ungroup := func(ts []Target) {
		zero := uint32(0)
		for _, t := range ts {
			_ = rm.Links.Set(context.WithoutCancel(ctx), t.Expect.Index, link.Change{Group: &zero})
		}
	}
	links, err := rm.Links.Links(ctx)
	if err != nil {
		ungroup(grouped)
		for _, t := range grouped {
			out.fail(rm.Log, t, StageLink, fmt.Errorf("read link group %#x before delete: %w", group, err))
		}
		return
	}
	ours := make(map[uint32]Target, len(grouped))
	for _, t := range grouped {
		ours[t.Expect.Index] = t
	}
	members := 0
	for _, l := range links {
		if l.Group != group {
			continue
		}
		t, ok := ours[l.Index]
		if !ok {
			// A link this pass did not verify is in the group: delete
			// nothing. It is left alone; ours are moved back.
			ungroup(grouped)
			for _, t := range grouped {
				out.fail(rm.Log, t, StageLink, fmt.Errorf("link group %#x also holds %s (ifindex %d), not verified by this pass", group, l.Name, l.Index))
			}
			return
		}
		tap, isTap := l.AsTap()
		if !isTap || (tap.Held() && !rm.ignoreHeld) || l.Name != t.Expect.Name || l.Alias != t.Expect.Alias {
			ungroup([]Target{t})
			delete(ours, l.Index)
			out.keep(rm.Log, t, "changed or held while grouped for delete")
			continue
		}
		members++
	}
	if members == 0 {
		return
	}
	if err := rm.Links.DeleteGroup(ctx, group); err != nil {
		ungroup(grouped)
		for _, t := range ours {
			out.fail(rm.Log, t, StageLink, err)
		}
		return
	}
	for _, t := range slices.SortedFunc(maps.Values(ours), func(a, b Target) int { return cmp.Compare(a.Expect.Index, b.Expect.Index) }) {
		out.Reclaimed = append(out.Reclaimed, tapRefOf(t))
		rm.Log.Info("tap removed", "tap", t.Expect.Name, "ifindex", t.Expect.Index, "owner", t.Expect.Alias, "identity", t.Identity.String())
	}
}

func tapRefOf(t Target) TapRef {
	return TapRef{Name: t.Expect.Name, Ifindex: t.Expect.Index, Owner: t.Expect.Alias, Identity: t.Identity}
}

func (o *Outcome) keep(log *slog.Logger, t Target, why string) {
	o.Kept = append(o.Kept, Kept{Tap: tapRefOf(t), Why: why})
	log.Info("tap kept", "tap", t.Expect.Name, "ifindex", t.Expect.Index, "owner", t.Expect.Alias, "why", why)
}

func (o *Outcome) fail(log *slog.Logger, t Target, stage string, err error) {
	o.Failed = append(o.Failed, Failure{Tap: tapRefOf(t), Stage: stage, Error: err.Error()})
	log.Warn("tap removal failed, kept for a later attempt", "tap", t.Expect.Name, "ifindex", t.Expect.Index, "stage", stage, "error", err)
}

// groupBase marks link groups this package reserves ('G' in the top byte);
// the low bits are random so that two passes, or two nodes' tools, never
// share one.
const groupBase = 0x47 << 24

func reserveGroup(dump []link.Link) uint32 {
	used := make(map[uint32]bool, len(dump))
	for _, l := range dump {
		used[l.Group] = true
	}
	for {
		g := uint32(groupBase | rand.IntN(1<<24-1) + 1)
		if !used[g] {
			return g
		}
	}
}
