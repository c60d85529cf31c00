package cnitap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tap"
	"github.com/datum-cloud/galactic-node/node/teardown"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/node/vrf"
)

// Error codes of this plugin, beyond the CNI's well-known ones (100 and up
// are plugin-defined).
const (
	ErrOwnedByAnother uint = 100 // the tap is stamped by another container
	ErrCheckFailed    uint = 101 // CHECK found the attachment not as ADD left it
	ErrGCIncomplete   uint = 102 // GC could not remove every stale tap
)

// lockTimeout bounds the wait for a VRF lock; the runtime retries.
const lockTimeout = 30 * time.Second

// Plugin runs CNI commands. Log goes to the runtime's log (stderr).
type Plugin struct {
	Log *slog.Logger
}

// env is what a command works with: this namespace's links, the datapath,
// the registry and the locks.
type env struct {
	conn  *link.Conn
	dp    *datapath.Datapath  // nil when the pinned maps cannot be opened (DEL only)
	reg   *attachreg.Registry // nil with dp
	locks *vrf.Locker
	taps  *tap.Manager
	// rows clears a removed tap's rows: reg, or rowsLeft when the maps
	// cannot be opened.
	rows teardown.Registry
}

// open opens the daemon's pinned maps (with the program when the command
// attaches it), the registry, and this namespace's links and locks. It
// never mounts a bpffs or creates maps: see datapath.OpenPinned.
func (p *Plugin) open(conf NetConf, withProgram bool) (*env, error) {
	open := datapath.OpenPinned
	if withProgram {
		open = datapath.LoadPinned
	}
	dp, err := open(conf.BPFFS)
	if err != nil {
		return nil, err
	}
	reg := attachreg.New(dp, nil, p.Log)
	e, err := p.openLinks(conf, reg)
	if err != nil {
		dp.Close()
		return nil, err
	}
	e.dp, e.reg = dp, reg
	return e, nil
}

// openWithoutRows is open for a DEL over maps this build cannot read: a
// rows stand-in leaves every row to the orphan collection of a daemon that
// can read them.
func (p *Plugin) openWithoutRows(conf NetConf, cause error) (*env, error) {
	return p.openLinks(conf, rowsLeft{log: p.Log, cause: cause})
}

// openLinks opens this namespace's links and the VRF locks, with rows as
// what clears a removed tap's rows.
func (p *Plugin) openLinks(conf NetConf, rows teardown.Registry) (*env, error) {
	conn, err := link.Dial(nil)
	if err != nil {
		return nil, err
	}
	locks, err := vrf.NewLocker(conf.VRFLockDir)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &env{conn: conn, locks: locks, taps: tap.NewManager(nil, conn, p.Log), rows: rows}, nil
}

// rowsLeft is the rows of a tap whose maps this build cannot open: removing
// the tap leaves them, logged, for the orphan collection, which clears rows
// whose ifindex no link has.
type rowsLeft struct {
	log   *slog.Logger
	cause error
}

func (r rowsLeft) UnregisterInterface(_ context.Context, ifindex uint32) error {
	r.log.Warn("DEL left the removed tap's eBPF rows for the orphan collection: this plugin cannot open the pinned maps",
		"ifindex", ifindex, "error", r.cause)
	return nil
}

// remover is the one teardown over this namespace's parts; the kernel
// probe proves single-queue taps free.
func (e *env) remover(log *slog.Logger) *teardown.Remover {
	return &teardown.Remover{Links: e.conn, Registry: e.rows, Locks: e.locks, Prober: e.prober(), LockTimeout: lockTimeout, Log: log}
}

func (e *env) prober() holder.Prober { return holder.Prober{Links: e.conn} }

func (e *env) close() {
	e.conn.Close()
	if e.dp != nil {
		e.dp.Close()
	}
}

// run parses the request, opens the node's parts and calls do, answering
// any failure as a CNI error.
func (p *Plugin) run(args *skel.CmdArgs, cmd command, do func(*invocation, *env) error) error {
	inv, err := parse(args, cmd)
	if err != nil {
		return cniError(err)
	}
	e, err := p.open(inv.conf, cmd == cmdAdd)
	if err != nil {
		return cniError(err)
	}
	defer e.close()
	return cniError(do(inv, e))
}

// cniError maps an error to a CNI error with a code and its message.
func cniError(err error) error {
	var te *types.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te):
		return te
	case errors.Is(err, errConfig):
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	case errors.Is(err, tap.ErrOwnedByAnother):
		return types.NewError(ErrOwnedByAnother, err.Error(), "")
	case errors.Is(err, context.DeadlineExceeded):
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	case errors.Is(err, datapath.ErrNotPinned):
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// Add creates or adopts the tap, stamps it with the container ID, enslaves
// it, adds its routes and registers its rows, under the VPC's VRF lock. On
// failure it undoes what it made; a tap it adopted is never deleted.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	return p.run(args, cmdAdd, p.add)
}

func (p *Plugin) add(inv *invocation, e *env) error {
	// Read before anything is made: a chain's result that does not parse
	// is a configuration error that changes nothing.
	prev, err := prevResult(inv.conf)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), lockTimeout)
	defer cancel()
	unlock, err := e.locks.Lock(ctx, inv.identity.VPC)
	if err != nil {
		return err
	}
	defer unlock()
	ctx = context.WithoutCancel(ctx) // holding the lock, finish what is started

	cfg := inv.tap
	if l, err := e.conn.GetByName(ctx, inv.identity.TapName()); err == nil {
		if err := p.refuseLiveOwner(inv, l); err != nil {
			return err
		}
		if l.Alias != "" && l.Alias != inv.containerID {
			// A container whose DEL never ran stamped this tap for the
			// same identity: it is ours to take over unless something
			// holds it.
			if err := p.mayTakeOver(ctx, e, l); err != nil {
				return err
			}
			cfg.Replaces = l.Alias
		}
	}
	res, err := e.taps.Create(ctx, cfg)
	if err != nil {
		return err
	}
	if err := e.reg.RegisterInterface(ctx, res.Tap.Index, inv.reg); err != nil {
		if !res.Adopted {
			err = errors.Join(err, p.undo(ctx, e, inv, res.Tap.Index))
		}
		return err
	}
	p.removeDeadTemps(inv.conf.DataDir, res.Tap.Name)
	rec := record{Tap: res.Tap.Name, ContainerID: inv.containerID, IfName: inv.ifName, NetNS: inv.netns, HostNetNS: p.hostNetNS(e)}
	if err := writeRecord(inv.conf.DataDir, inv.conf.Name, rec); err != nil {
		// Without its record no GC would ever find the tap: undo.
		if !res.Adopted {
			err = errors.Join(err, p.undo(ctx, e, inv, res.Tap.Index))
		}
		return err
	}
	if cfg.Replaces != "" {
		p.Log.Warn("ADD took over a tap another container stamped and left unheld", "container", inv.containerID,
			"previous_container", cfg.Replaces, "tap", res.Tap.Name, "ifindex", res.Tap.Index)
	}
	p.Log.Info("ADD", "container", inv.containerID, "tap", res.Tap.Name, "ifindex", res.Tap.Index, "adopted", res.Adopted)
	// In a chain the result is the previous plugins' with the tap added:
	// a runtime keeps only the last plugin's result, so dropping theirs
	// would drop the pod's addresses, routes and DNS.
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if prev != nil {
		result = prev
	}
	result.Interfaces = append(result.Interfaces, &current.Interface{Name: res.Tap.Name, Mac: res.Tap.Address.String()})
	return types.PrintResult(result, inv.conf.CNIVersion)
}

// undo removes what a failed ADD made: the tap it created, then any rows
// it registered, in the teardown's order (link first, so no tap is left
// without its rows). It never touches an adopted tap; callers check.
func (p *Plugin) undo(ctx context.Context, e *env, inv *invocation, ifindex uint32) error {
	if err := e.taps.Delete(ctx, inv.identity, inv.containerID); err != nil {
		return fmt.Errorf("undo: %w", err)
	}
	if err := e.reg.UnregisterInterface(ctx, ifindex); err != nil {
		return fmt.Errorf("undo: tap deleted, rows left for the orphan collection: %w", err)
	}
	p.Log.Info("ADD failed and removed the tap it made, with its rows", "container", inv.containerID, "tap", inv.identity.TapName(), "ifindex", ifindex)
	return nil
}

// Del deletes the tap and then clears its rows, through the one teardown
// path, only if this container stamped it. A tap that is gone, or another
// container's, is success. A tap still held is removed all the same: the
// runtime has ended the attachment, and no other path would ever take it.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	inv, err := parse(args, cmdDel)
	if err != nil {
		return cniError(err)
	}
	if inv.identityErr != nil {
		p.Log.Warn("DEL: the attachment identity does not parse, so no ADD made a tap of it; removing what this attachment recorded",
			"container", inv.containerID, "ifname", inv.ifName, "error", inv.identityErr)
	}
	e, err := p.open(inv.conf, false)
	if errors.Is(err, datapath.ErrNotPinned) {
		return cniError(p.delUnpinned(inv, err))
	}
	if errors.Is(err, datapath.ErrIncompatiblePins) {
		// An upgrade or downgrade whose daemon pinned another layout: the
		// tap still goes, or no pod of this node could ever be deleted.
		p.Log.Warn("DEL cannot open the pinned maps (another build's layout); removing the tap without its rows",
			"container", inv.containerID, "ifname", inv.ifName, "error", err)
		e, err = p.openWithoutRows(inv.conf, err)
	}
	if err != nil {
		return cniError(err)
	}
	defer e.close()
	return cniError(p.del(inv, e))
}

// delUnpinned is DEL while the daemon's maps are not pinned (it has not
// started yet, or was removed): no rows can exist, so DEL succeeds when no
// tap of this attachment does either, and otherwise leaves the tap for a
// DEL retried once the daemon is up, since its rows cannot be cleared.
func (p *Plugin) delUnpinned(inv *invocation, notPinned error) error {
	conn, err := link.Dial(nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	own, err := p.ownTaps(context.Background(), &env{conn: conn}, inv)
	if err != nil {
		return err
	}
	var left []string
	for _, t := range own {
		if t.Owner() == inv.containerID {
			left = append(left, t.Name)
		}
	}
	if len(left) > 0 {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("DEL cannot remove %s before the node daemon pins its maps", strings.Join(left, ", ")), notPinned.Error())
	}
	if inv.hasIdentity {
		if err := removeRecord(inv.conf.DataDir, inv.conf.Name, inv.identity.TapName()); err != nil && !errors.Is(err, errConfig) {
			p.Log.Warn("DEL left the record of a tap already gone", "container", inv.containerID, "tap", inv.identity.TapName(), "error", err)
		}
	}
	p.Log.Info("DEL found nothing to remove; the node daemon's maps are not pinned", "container", inv.containerID, "ifname", inv.ifName)
	return nil
}

func (p *Plugin) del(inv *invocation, e *env) error {
	ctx := context.Background()
	if inv.hasIdentity {
		// A DEL without an identity names no tap to lock; GC and the
		// daemon's collection remove that attachment's temp files.
		if err := p.removeDeadTempsLocked(ctx, e, inv.conf.DataDir, inv.identity); err != nil {
			p.Log.Warn("DEL left temp files of killed record writers", "tap", inv.identity.TapName(), "error", err)
		}
	}
	own, err := p.ownTaps(ctx, e, inv)
	if err != nil {
		return err
	}
	if len(own) == 0 && inv.hasIdentity {
		return p.clearGone(ctx, e, inv)
	}
	var targets, unstamped []teardown.TapRef
	for _, t := range own {
		switch {
		case t.Owner() == "" && inv.hasIdentity:
			// Half-made by an ADD killed before its stamp (plugins
			// before this one persisted first): nothing else would
			// ever remove it. Removed only if nothing holds it.
			unstamped = append(unstamped, teardown.RefOf(t))
		case t.Owner() != inv.containerID:
			p.Log.Info("DEL leaves a tap another container stamped", "container", inv.containerID, "tap", t.Name, "stamp", t.Owner())
		default:
			other, err := p.otherRecord(inv, t.Name, t.Owner())
			if err != nil {
				return err
			}
			if other != nil {
				// The same container attached it through another
				// network or interface: that attachment's DEL removes it.
				p.Log.Info("DEL leaves a tap another attachment of its container recorded", "container", inv.containerID,
					"tap", t.Name, "network", other.Network, "ifname", other.IfName)
				if err := removeRecord(inv.conf.DataDir, inv.conf.Name, t.Name); err != nil {
					p.Log.Warn("DEL left a record", "tap", t.Name, "error", err)
				}
				continue
			}
			targets = append(targets, teardown.RefOf(t))
		}
	}
	if len(unstamped) > 0 {
		out := e.remover(p.Log).Remove(ctx, unstamped, teardown.Options{})
		for _, t := range out.Removed {
			p.Log.Info("DEL removed an unstamped tap of its identity that nothing held", "container", inv.containerID, "tap", t.Name, "ifindex", t.Ifindex)
		}
		for _, k := range out.Kept {
			p.Log.Warn("DEL left an unstamped tap of its identity", "container", inv.containerID, "tap", k.Tap.Name, "why", k.Why)
		}
	}
	if len(targets) == 0 {
		return nil
	}
	out := e.remover(p.Log).Remove(ctx, targets, teardown.Options{RemoveHeld: true})
	for _, k := range out.Kept {
		p.Log.Info("DEL found the tap changed", "container", inv.containerID, "tap", k.Tap.Name, "why", k.Why)
	}
	for _, t := range out.Removed {
		p.Log.Info("DEL", "container", inv.containerID, "tap", t.Name, "ifindex", t.Ifindex)
		if err := removeRecord(inv.conf.DataDir, inv.conf.Name, t.Name); err != nil {
			p.Log.Warn("DEL left a record", "tap", t.Name, "error", err)
		}
	}
	return failures("DEL", out)
}

// clearGone clears what ADD registered for the identity when its tap is
// already gone (deleted by something else): the rows whose ifindex_vrf row
// names the identity and whose ifindex has no link, and their pin.
func (p *Plugin) clearGone(ctx context.Context, e *env, inv *invocation) error {
	// A record left behind (a read-only or full folder) names a tap that
	// is gone: GC drops it later, and failing here would leave the runtime
	// unable to ever remove the sandbox.
	if err := removeRecord(inv.conf.DataDir, inv.conf.Name, inv.identity.TapName()); err != nil && !errors.Is(err, errConfig) {
		p.Log.Warn("DEL left the record of a tap already gone", "container", inv.containerID, "tap", inv.identity.TapName(), "error", err)
	}
	if e.reg == nil {
		return nil // maps this build cannot open: their rows are the orphan collection's
	}
	regs, err := e.reg.Registered()
	if err != nil {
		return err
	}
	var gone []teardown.Gone
	for _, r := range regs {
		if r.Identity == inv.identity {
			gone = append(gone, teardown.Gone{Ifindex: r.Ifindex, Identity: r.Identity})
		}
	}
	if len(gone) == 0 {
		return nil
	}
	cleared, _, failed := e.remover(p.Log).ClearGone(ctx, gone, false)
	for _, g := range cleared {
		p.Log.Info("DEL cleared the rows of a tap already gone", "container", inv.containerID, "identity", inv.identity.String(), "ifindex", g.Ifindex)
	}
	if err := errors.Join(failed...); err != nil {
		return types.NewError(types.ErrInternal, "DEL could not clear the rows of a gone tap", err.Error())
	}
	return nil
}

// hostNetNS names the namespace this command's taps are in, for a record
// (record.HostNetNS). Without it the record is one as records were before
// they named it, which the daemon's collection judges by its VRF instead:
// no reason to fail the command.
func (p *Plugin) hostNetNS(e *env) string {
	ns, err := e.conn.NetNS()
	if err != nil {
		p.Log.Warn("the record will not name the tap's network namespace", "error", err)
	}
	return ns
}

// removeDeadTemps removes the temp files writeRecord left of tap when its
// process was killed before the rename, in every network's folder. The
// caller holds tap's VPC lock, so each is a dead writer's (removeTemps). A
// failure costs only a file the daemon's collection retries: logged.
func (p *Plugin) removeDeadTemps(dataDir, tap string) {
	paths, err := tempsOfTap(dataDir, tap)
	var removed []string
	if err == nil {
		removed, err = removeTemps(paths)
	}
	if len(removed) > 0 {
		p.Log.Info("removed temp files of record writers killed before their rename", "tap", tap, "files", removed)
	}
	if err != nil {
		p.Log.Warn("left temp files of killed record writers", "tap", tap, "error", err)
	}
}

// removeDeadTempsLocked is removeDeadTemps under id's VPC lock, for a
// command that does not hold it otherwise.
func (p *Plugin) removeDeadTempsLocked(ctx context.Context, e *env, dataDir string, id identity.Identity) error {
	lctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	unlock, err := e.locks.Lock(lctx, id.VPC)
	if err != nil {
		return err
	}
	defer unlock()
	p.removeDeadTemps(dataDir, id.TapName())
	return nil
}

// readRecords reads the network's records and logs, with their count, the
// ones it had to move aside: they name no attachment, so GC and DEL carry
// on without them, and the daemon's reclaim still sees their taps.
func (p *Plugin) readRecords(inv *invocation) ([]record, error) {
	records, unreadable, err := readRecords(inv.conf.DataDir, inv.conf.Name)
	if len(unreadable) > 0 {
		p.Log.Warn("records that do not parse were moved aside", "network", inv.conf.Name, "count", len(unreadable), "records", unreadable)
	}
	return records, err
}

// failures is the CNI error for the targets a teardown could not finish,
// or nil.
func failures(cmd string, out teardown.Outcome) error {
	if len(out.Failed) == 0 {
		return nil
	}
	var msgs []string
	for _, f := range out.Failed {
		msgs = append(msgs, fmt.Sprintf("%s (%s): %s", f.Tap.Name, f.Stage, f.Error))
	}
	sort.Strings(msgs)
	code := types.ErrInternal
	if cmd == "GC" {
		code = ErrGCIncomplete
	}
	return types.NewError(code, fmt.Sprintf("%s could not finish %d taps", cmd, len(out.Failed)), strings.Join(msgs, "; "))
}

// ownTaps finds the taps DEL acts on: the one named from the identity, or,
// when the runtime gives none on DEL, every tenant tap this container
// stamped.
func (p *Plugin) ownTaps(ctx context.Context, e *env, inv *invocation) ([]link.Tap, error) {
	if inv.hasIdentity {
		l, err := e.conn.GetByName(ctx, inv.identity.TapName())
		if errors.Is(err, link.ErrLinkGone) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		t, ok := l.AsTap()
		if !ok {
			return nil, fmt.Errorf("%s: %w", l.Name, tap.ErrNotATap)
		}
		return []link.Tap{t}, nil
	}
	links, err := e.conn.Links(ctx)
	if err != nil {
		return nil, err
	}
	// This network's records say which taps the attachment (container,
	// interface) added; a tap another network recorded is never this DEL's.
	// Taps made before records existed are found by their stamp alone.
	records, err := p.readRecords(inv)
	if err != nil {
		return nil, err
	}
	mine := map[string]bool{}
	for _, r := range records {
		if r.ContainerID == inv.containerID && r.IfName == inv.ifName {
			mine[r.Tap] = true
		}
	}
	var own []link.Tap
	for _, t := range link.TenantTaps(links) {
		if inv.containerID == "" || t.Owner() != inv.containerID {
			continue
		}
		if mine[t.Name] || (len(mine) == 0 && !recordedAnywhere(inv.conf.DataDir, t.Name)) {
			own = append(own, t)
		}
	}
	return own, nil
}

// otherRecord returns a record of tap that speaks for it (its container
// stamped it) and is not this attachment's (network, container, interface),
// or nil. One tap has one owner: the attachment that recorded it.
func (p *Plugin) otherRecord(inv *invocation, tap, stamp string) (*networkRecord, error) {
	recs, err := recordsOfTap(inv.conf.DataDir, tap)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.Network == inv.conf.Name && r.ContainerID == inv.containerID && r.IfName == inv.ifName {
			continue
		}
		if r.speaksFor(stamp) {
			return &r, nil
		}
	}
	return nil, nil
}

// refuseLiveOwner refuses ADD of a tap another attachment recorded while
// that attachment is live: the same container through another network or
// interface, or another container whose sandbox namespace still exists.
// Taking it over would restamp the tap and rewrite its rows under a live
// workload, and either attachment's DEL would then delete the other's tap.
// Another container with no such proof of life is left to mayTakeOver.
func (p *Plugin) refuseLiveOwner(inv *invocation, l link.Link) error {
	other, err := p.otherRecord(inv, l.Name, l.Alias)
	if err != nil || other == nil {
		return err
	}
	var why string
	switch {
	case other.ContainerID == inv.containerID:
		why = "this container"
	case sandboxLive(other.NetNS, inv.netns):
		why = "container " + other.ContainerID + ", whose namespace " + other.NetNS + " still exists"
	default:
		return nil
	}
	return fmt.Errorf("%s is attached as network %q interface %q of %s; a tap has one owner, so the network configs must not share an identity: %w",
		l.Name, other.Network, other.IfName, why, tap.ErrOwnedByAnother)
}

// mayTakeOver allows ADD to take over l, which another container stamped
// for the same identity, only when nothing holds it: the kernel's
// attributes and, when they call it free, its answer to an attach (released
// at once). Otherwise the error names what holds it, as far as a scan of
// the host's processes sees.
func (p *Plugin) mayTakeOver(ctx context.Context, e *env, l link.Link) error {
	t, ok := l.AsTap()
	if !ok {
		return fmt.Errorf("%s is kind %q: %w", l.Name, l.Kind, tap.ErrNotATap)
	}
	held, why := holder.Held(t)
	if !held {
		c, err := e.prober().Claim(ctx, t)
		if err == nil {
			c.Release()
			return nil
		}
		if !errors.Is(err, holder.ErrHeld) {
			return fmt.Errorf("take over %s: %w", l.Name, err)
		}
		why = err.Error()
	}
	msg := fmt.Sprintf("%s is stamped by container %s and held (%s)", l.Name, l.Alias, why)
	if hs := (holder.Proc{Root: "/proc"}).Scan(ctx).Holders(l.Name); len(hs) > 0 {
		pids := make([]string, len(hs))
		for i, h := range hs {
			pids[i] = fmt.Sprintf("pid %d (%s)", h.PID, h.Command)
		}
		msg += " by " + strings.Join(pids, ", ")
	}
	return fmt.Errorf("%s: %w", msg, tap.ErrOwnedByAnother)
}
