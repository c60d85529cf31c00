// Package teardown removes tenant taps: the one path that CNI DEL, CNI GC,
// the lab's `galactic-node tap del` and the stale tap reclaim share.
//
// The rules a caller must know: every target is removed under its VPC's VRF
// lock, only after its link was read again with the same ifindex, name and
// owner stamp, found not held (unless the caller is the owner's own DEL),
// passed the caller's recheck, and was claimed by the kernel probe
// (holder.Prober): the probe's file stays attached until the link is gone,
// so no VMM attaches to a single-queue tap between the last check and the
// delete. The link goes before its eBPF rows: a tap
// is never left existing without its rows and program, so a tap kept at any
// check, or whose delete failed, keeps exactly what it had. A crash between
// the link and its rows leaves rows keyed by an ifindex that no longer
// exists, which the orphan collection removes.
//
// The package depends only on the link layer and on interfaces, so that the
// CNI plugin links no client library it does not use.
package teardown

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
	"github.com/datum-cloud/galactic-node/node/tun/holder"
)

// Links is what a teardown needs of the link layer; *link.Conn implements it.
type Links interface {
	Links(ctx context.Context) ([]link.Link, error)
	Verify(ctx context.Context, want link.Expect) (link.Link, error)
	Set(ctx context.Context, index uint32, ch link.Change) error
	DeleteVerified(ctx context.Context, want link.Expect) error
	DeleteGroup(ctx context.Context, group uint32) error
}

// Registry clears an interface's eBPF rows; *attachreg.Registry implements it.
type Registry interface {
	UnregisterInterface(ctx context.Context, ifindex uint32) error
}

// Locker takes a VPC's VRF lock; *vrf.Locker implements it.
type Locker interface {
	Lock(ctx context.Context, vpc identity.VPC) (unlock func(), err error)
}

// Stage is where a removal failed. It marshals as its string, which
// operators and the failures metric's stage label read.
type Stage string

// Failure stages.
const (
	StageLock   Stage = "lock"   // the VRF lock could not be taken in time
	StageVerify Stage = "verify" // the link could not be read again
	StageProbe  Stage = "probe"  // the kernel could not be asked whether a file holds the tap
	StageRows   Stage = "rows"   // the link is gone but its rows could not all be cleared
	StageLink   Stage = "link"   // the link could not be grouped or deleted
)

// TapRef names a tap as it was read. Reports carry it, and it is what
// Remove takes: a target is removed only while its link still shows the
// ifindex, name and owner it was read with (Expect).
type TapRef struct {
	Name     string            `json:"name"`
	Ifindex  uint32            `json:"ifindex"`
	Owner    string            `json:"owner"`
	Identity identity.Identity `json:"identity"`
}

// RefOf returns the TapRef of t as read now.
func RefOf(t link.Tap) TapRef {
	return TapRef{Name: t.Name, Ifindex: t.Index, Owner: t.Owner(), Identity: t.Identity}
}

// Expect is what the link of r must still show for r to be removed.
func (r TapRef) Expect() link.Expect {
	return link.Expect{Index: r.Ifindex, Name: r.Name, Alias: r.Owner}
}

// Kept is a target a check kept, and why.
type Kept struct {
	Tap TapRef `json:"tap"`
	Why string `json:"why"`
}

// Failure is a target whose removal failed at a stage. A failure at any
// stage but StageRows left the tap as it was.
type Failure struct {
	Tap   TapRef `json:"tap"`
	Stage Stage  `json:"stage"`
	Error string `json:"error"`
}

// Outcome is what Remove did with each target. A target whose link went but
// whose rows did not is in Removed and in Failed (StageRows).
type Outcome struct {
	Removed []TapRef
	// Removing are the taps whose delete is under way. The kernel unlists
	// a link before it answers its delete (the answer waits for
	// netdev_run_todo's RCU barrier and the device's last references,
	// net/core/dev.c), so a tap can be gone from every dump for tens of
	// milliseconds before Removed names it; Progress hears of it here
	// first, so that a tap gone is never a tap the caller's report does
	// not name.
	Removing    []TapRef
	WouldRemove []TapRef
	Kept        []Kept
	Failed      []Failure
}

// Rechecker is the caller's last word on the targets that passed every
// other check, asked under the VRF locks after their links were read again.
type Rechecker interface {
	// Recheck is called once per Remove and takes what the verdicts rest
	// on (a fresh read, say). An error keeps every target.
	Recheck(ctx context.Context) error
	// KeepWhy, asked of each target after Recheck succeeded, says why it
	// must now be kept; empty: it may go.
	KeepWhy(t TapRef) string
}

// Prober proves a tap free by attaching to it; holder.Prober implements it.
type Prober interface {
	Claim(ctx context.Context, t link.Tap) (*holder.Claim, error)
}

// Options modify one Remove.
type Options struct {
	// Recheck, if set, is the caller's last word on each target.
	Recheck Rechecker
	// DryRun reports what would be removed and changes nothing.
	DryRun bool
	// RemoveHeld removes a tap even while a process holds it, without
	// probing it. Only the owner's own CNI DEL sets it: the runtime has
	// ended the attachment, and refusing would leave a tap no other path
	// may take.
	RemoveHeld bool
	// Dump is a recent link dump, used to choose a free link group; nil
	// chooses at random (a collision is caught before any delete).
	Dump []link.Link
	// Progress, if set, is called with the outcome so far each time a
	// target is removed, kept or fails, while the VRF locks are held: it
	// must not block, and must copy what it keeps.
	Progress func(Outcome)
}

// Remover removes tenant taps.
type Remover struct {
	Links    Links
	Registry Registry
	Locks    Locker
	// Prober claims each tap before its delete; nil keeps every
	// single-queue tap (nothing else proves one free) and removes
	// multiqueue taps on their queue counts alone.
	Prober Prober
	// LockTimeout bounds the wait for the VRF locks. Default 10 s.
	LockTimeout time.Duration
	Log         *slog.Logger
}

// Remove removes every target that passes every check, and reports each.
func (rm *Remover) Remove(ctx context.Context, targets []TapRef, opts Options) Outcome {
	var out Outcome
	o := &run{rm: rm, log: rm.log(), opts: opts, out: &out, read: map[uint32]link.Tap{}, claims: map[uint32]*holder.Claim{}}
	unlock := o.lock(ctx, targets)
	defer unlock()
	// Claims are released once their links are gone (or kept), before
	// the locks: a VMM may attach again only to a tap that stays.
	defer o.release()
	if len(o.locked) == 0 {
		return out
	}
	var verified []TapRef
	for _, t := range o.locked {
		if why, err := o.recheckLink(ctx, t); err != nil {
			o.fail(t, StageVerify, err)
		} else if why != "" {
			o.keep(t, why)
		} else {
			verified = append(verified, t)
		}
	}
	if len(verified) == 0 {
		return out
	}
	if opts.Recheck != nil {
		if err := opts.Recheck.Recheck(ctx); err != nil {
			for _, t := range verified {
				o.keep(t, err.Error())
			}
			return out
		}
	}
	var batch []TapRef
	for _, t := range verified {
		if why := o.keepWhy(t); why != "" {
			o.keep(t, why)
		} else if opts.DryRun {
			out.WouldRemove = append(out.WouldRemove, t)
			o.changed()
		} else {
			batch = append(batch, t)
		}
	}
	if !opts.RemoveHeld {
		batch = o.claim(ctx, batch)
	}
	var deleted []TapRef
	switch len(batch) {
	case 0:
		return out
	case 1:
		deleted = o.deleteOne(ctx, batch[0])
	default:
		deleted = o.deleteGroup(ctx, batch)
	}
	o.clearRows(ctx, deleted)
	return out
}

// keepWhy is the caller's recheck verdict on t; no recheck keeps nothing.
func (o *run) keepWhy(t TapRef) string {
	if o.opts.Recheck == nil {
		return ""
	}
	return o.opts.Recheck.KeepWhy(t)
}

// run is the state of one Remove.
type run struct {
	rm     *Remover
	log    *slog.Logger
	opts   Options
	out    *Outcome
	locked []TapRef
	// read is each target's tap as read again under the lock, what the
	// probe attaches to; claims are the probe's attachments, by ifindex.
	read   map[uint32]link.Tap
	claims map[uint32]*holder.Claim
}

// claim probes each target: the kernel says whether another file holds
// it, and a target it calls free stays claimed until Remove returns. A
// target the probe could not ask about fails at StageProbe and is kept.
func (o *run) claim(ctx context.Context, batch []TapRef) []TapRef {
	var claimed []TapRef
	for _, t := range batch {
		tap := o.read[t.Ifindex]
		if o.rm.Prober == nil {
			if tap.Tun == nil || !tap.Tun.MultiQueue {
				o.keep(t, "single-queue tap and no kernel probe: only an attach proves it free")
				continue
			}
			claimed = append(claimed, t)
			continue
		}
		c, err := o.rm.Prober.Claim(ctx, tap)
		switch {
		case errors.Is(err, holder.ErrHeld):
			o.keep(t, "held at probe: "+err.Error())
		case errors.Is(err, link.ErrLinkGone):
			o.keep(t, "gone before delete")
		case errors.Is(err, link.ErrLinkChanged):
			o.keep(t, "changed before delete: "+err.Error())
		case err != nil:
			o.fail(t, StageProbe, err)
		default:
			o.claims[t.Ifindex] = c
			claimed = append(claimed, t)
		}
	}
	return claimed
}

// release detaches every claim: after their links are gone, or from taps
// kept after the probe, which are left as they were.
func (o *run) release() {
	for _, c := range o.claims {
		c.Release()
	}
}

// lock takes the VRF locks of the targets' VPCs in VPC order, so that two
// removers never wait on each other; targets whose lock is not had in time
// fail at StageLock. It returns the function that releases them all.
func (o *run) lock(ctx context.Context, targets []TapRef) func() {
	byVPC := map[identity.VPC][]TapRef{}
	for _, t := range targets {
		byVPC[t.Identity.VPC] = append(byVPC[t.Identity.VPC], t)
	}
	lockCtx, cancel := context.WithTimeout(ctx, o.rm.lockTimeout())
	defer cancel()
	var unlocks []func()
	for _, vpc := range slices.Sorted(maps.Keys(byVPC)) {
		unlock, err := o.rm.Locks.Lock(lockCtx, vpc)
		if err != nil {
			for _, t := range byVPC[vpc] {
				o.fail(t, StageLock, err)
			}
			continue
		}
		unlocks = append(unlocks, unlock)
		o.locked = append(o.locked, byVPC[vpc]...)
	}
	return func() {
		for i := len(unlocks) - 1; i >= 0; i-- {
			unlocks[i]()
		}
	}
}

// recheckLink reads the link again: it returns why the tap must be kept, or
// an error when the read itself failed.
func (o *run) recheckLink(ctx context.Context, t TapRef) (string, error) {
	l, err := o.rm.Links.Verify(ctx, t.Expect())
	switch {
	case errors.Is(err, link.ErrLinkGone):
		return "gone before removal", nil
	case errors.Is(err, link.ErrLinkChanged):
		return err.Error(), nil
	case err != nil:
		return "", err
	}
	if tap, ok := l.AsTap(); ok {
		o.read[t.Ifindex] = tap
	}
	return o.keepHeld(l, "at recheck"), nil
}

// keepHeld says why l must be kept at the given point: not a tenant tap any
// more, or held (unless the owner's DEL removes held taps). A claimed tap
// is held when a file besides the claim's holds it.
func (o *run) keepHeld(l link.Link, when string) string {
	tap, ok := l.AsTap()
	if !ok {
		return "no longer reads as a tenant tap " + when
	}
	held, why := holder.Held(tap)
	if c := o.claims[l.Index]; c != nil {
		held, why = c.HeldByOthers(l)
	}
	if !held {
		return ""
	}
	if o.opts.RemoveHeld {
		o.log.Warn("removing a held tap at its owner's request", "tap", l.Name, "ifindex", l.Index, "owner", l.Alias, "held", why)
		return ""
	}
	return "held " + when + ": " + why
}

// deleteOne removes a lone target with one verified delete after a last
// read; there is no group to check.
func (o *run) deleteOne(ctx context.Context, t TapRef) []TapRef {
	l, err := o.rm.Links.Verify(ctx, t.Expect())
	var why string
	switch {
	case errors.Is(err, link.ErrLinkGone):
		why = "gone before delete"
	case errors.Is(err, link.ErrLinkChanged):
		why = "changed before delete: " + err.Error()
	case err != nil:
		o.fail(t, StageLink, err)
		return nil
	default:
		why = o.keepHeld(l, "before delete")
	}
	if why != "" {
		o.keep(t, why)
		return nil
	}
	o.removing(t)
	if err := o.rm.Links.DeleteVerified(ctx, t.Expect()); err != nil && !errors.Is(err, link.ErrLinkGone) {
		o.out.Removing = nil
		if errors.Is(err, link.ErrLinkChanged) {
			o.keep(t, "changed before delete: "+err.Error())
		} else {
			o.fail(t, StageLink, err)
		}
		return nil
	}
	return []TapRef{t}
}

// deleteGroup moves the targets into a link group reserved for this batch,
// checks that the group holds exactly them, none held or changed, and
// deletes the group in one request: the kernel then unregisters them in one
// batch instead of one RCU grace period each. A link this batch did not
// verify in the group stops the delete.
func (o *run) deleteGroup(ctx context.Context, batch []TapRef) []TapRef {
	group := reserveGroup(o.opts.Dump)
	var grouped []TapRef
	for _, t := range batch {
		if err := o.rm.Links.Set(ctx, t.Ifindex, link.Change{Group: &group}); err != nil {
			o.fail(t, StageLink, fmt.Errorf("move to link group %#x: %w", group, err))
			continue
		}
		grouped = append(grouped, t)
	}
	if len(grouped) == 0 {
		return nil
	}
	ungroup := func(ts ...TapRef) {
		zero := uint32(0)
		for _, t := range ts {
			_ = o.rm.Links.Set(context.WithoutCancel(ctx), t.Ifindex, link.Change{Group: &zero})
		}
	}
	links, err := o.rm.Links.Links(ctx)
	if err != nil {
		ungroup(grouped...)
		for _, t := range grouped {
			o.fail(t, StageLink, fmt.Errorf("read link group %#x before delete: %w", group, err))
		}
		return nil
	}
	ours := make(map[uint32]TapRef, len(grouped))
	for _, t := range grouped {
		ours[t.Ifindex] = t
	}
	for _, l := range links {
		if l.Group != group {
			continue
		}
		t, ok := ours[l.Index]
		if !ok {
			// It is left alone; ours are moved back.
			ungroup(grouped...)
			for _, t := range grouped {
				o.fail(t, StageLink, fmt.Errorf("link group %#x also holds %s (ifindex %d), not verified by this batch", group, l.Name, l.Index))
			}
			return nil
		}
		why := ""
		if l.Name != t.Name || l.Alias != t.Owner {
			why = fmt.Sprintf("changed while grouped for delete: now %s stamped %q", l.Name, l.Alias)
		} else {
			why = o.keepHeld(l, "while grouped for delete")
		}
		if why != "" {
			ungroup(t)
			delete(ours, l.Index)
			o.keep(t, why)
		}
	}
	if len(ours) == 0 {
		return nil
	}
	o.removing(slices.SortedFunc(maps.Values(ours), func(a, b TapRef) int { return cmp.Compare(a.Ifindex, b.Ifindex) })...)
	if err := o.rm.Links.DeleteGroup(ctx, group); err != nil {
		o.out.Removing = nil
		ungroup(grouped...)
		for _, t := range ours {
			o.fail(t, StageLink, err)
		}
		return nil
	}
	return slices.SortedFunc(maps.Values(ours), func(a, b TapRef) int { return cmp.Compare(a.Ifindex, b.Ifindex) })
}

// clearRows clears the rows of links already deleted. Ifindexes are not
// reused until the kernel's counter wraps, so no new link owns these rows.
// The links are gone before their rows: they count as removed, and the
// caller hears so, before the first row is touched.
func (o *run) clearRows(ctx context.Context, deleted []TapRef) {
	o.out.Removing = nil
	if len(deleted) == 0 {
		return
	}
	o.out.Removed = append(o.out.Removed, deleted...)
	o.changed()
	for _, t := range deleted {
		if err := o.rm.Registry.UnregisterInterface(context.WithoutCancel(ctx), t.Ifindex); err != nil {
			o.fail(t, StageRows, fmt.Errorf("tap deleted, rows left for the orphan collection: %w", err))
		}
		o.log.Info("tap removed", "tap", t.Name, "ifindex", t.Ifindex, "owner", t.Owner, "identity", t.Identity.String())
	}
}

func (o *run) keep(t TapRef, why string) {
	o.out.Kept = append(o.out.Kept, Kept{Tap: t, Why: why})
	o.changed()
	o.log.Info("tap kept", "tap", t.Name, "ifindex", t.Ifindex, "owner", t.Owner, "why", why)
}

func (o *run) fail(t TapRef, stage Stage, err error) {
	o.out.Failed = append(o.out.Failed, Failure{Tap: t, Stage: stage, Error: err.Error()})
	o.changed()
	o.log.Warn("tap removal failed", "tap", t.Name, "ifindex", t.Ifindex, "stage", stage, "error", err)
}

// removing says, before the delete is sent, which taps it deletes.
func (o *run) removing(ts ...TapRef) {
	o.out.Removing = ts
	o.changed()
}

// changed tells the caller's Progress what the outcome is now.
func (o *run) changed() {
	if o.opts.Progress != nil {
		o.opts.Progress(*o.out)
	}
}

// groupBase marks link groups this package reserves ('G' in the top byte);
// the low bits are random so that two batches, or two nodes' tools, never
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
