package cnitap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/holder"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tap"
	"github.com/datum-cloud/galactic-node/node/teardown"
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
	dp    *datapath.Datapath
	reg   *attachreg.Registry
	locks *vrf.Locker
	taps  *tap.Manager
}

func (p *Plugin) open(conf NetConf) (*env, error) {
	conn, err := link.Dial(nil)
	if err != nil {
		return nil, err
	}
	dp, err := datapath.Load(conf.BPFFS)
	if err != nil {
		conn.Close()
		return nil, err
	}
	locks, err := vrf.NewLocker(conf.VRFLockDir)
	if err != nil {
		conn.Close()
		dp.Close()
		return nil, err
	}
	return &env{conn: conn, dp: dp, reg: attachreg.New(dp, nil, p.Log), locks: locks, taps: tap.NewManager(nil, conn, p.Log)}, nil
}

// remover is the one teardown over this namespace's parts; it scans the
// host's processes to prove single-queue taps free.
func (e *env) remover(log *slog.Logger) *teardown.Remover {
	return &teardown.Remover{Links: e.conn, Registry: e.reg, Locks: e.locks, Holders: holder.Proc{Root: "/proc"}, LockTimeout: lockTimeout, Log: log}
}

func (e *env) close() {
	e.conn.Close()
	e.dp.Close()
}

// run parses the request, opens the node's parts and calls do, answering
// any failure as a CNI error.
func (p *Plugin) run(args *skel.CmdArgs, needIdentity bool, do func(*invocation, *env) error) error {
	inv, err := parse(args, needIdentity)
	if err != nil {
		return cniError(err)
	}
	e, err := p.open(inv.conf)
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
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// Add creates or adopts the tap, stamps it with the container ID, enslaves
// it, adds its routes and registers its rows, under the VPC's VRF lock. On
// failure it undoes what it made; a tap it adopted is never deleted.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	return p.run(args, true, p.add)
}

func (p *Plugin) add(inv *invocation, e *env) error {
	ctx, cancel := context.WithTimeout(context.Background(), lockTimeout)
	defer cancel()
	unlock, err := e.locks.Lock(ctx, inv.identity.VPC)
	if err != nil {
		return err
	}
	defer unlock()
	ctx = context.WithoutCancel(ctx) // holding the lock, finish what is started

	res, err := e.taps.Create(ctx, inv.tap)
	if err != nil {
		return err
	}
	if err := e.reg.RegisterInterface(ctx, res.Tap.Index, inv.reg); err != nil {
		if !res.Adopted {
			if derr := e.taps.Delete(ctx, inv.identity, inv.containerID); derr != nil {
				err = errors.Join(err, fmt.Errorf("undo: %w", derr))
			}
		}
		return err
	}
	p.Log.Info("ADD", "container", inv.containerID, "tap", res.Tap.Name, "ifindex", res.Tap.Index, "adopted", res.Adopted)
	result := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: res.Tap.Name, Mac: res.Tap.Address.String()}},
	}
	return types.PrintResult(result, inv.conf.CNIVersion)
}

// Del deletes the tap and then clears its rows, through the one teardown
// path, only if this container stamped it. A tap that is gone, or another
// container's, is success. A tap still held is removed all the same: the
// runtime has ended the attachment, and no other path would ever take it.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	return p.run(args, false, func(inv *invocation, e *env) error {
		ctx := context.Background()
		own, err := p.ownTaps(ctx, e, inv)
		if err != nil {
			return err
		}
		if len(own) == 0 && inv.hasIdentity {
			return p.clearGone(ctx, e, inv)
		}
		var targets []teardown.Target
		for _, t := range own {
			if t.Alias != inv.containerID {
				p.Log.Info("DEL leaves a tap another container stamped", "container", inv.containerID, "tap", t.Name, "stamp", t.Alias)
				continue
			}
			targets = append(targets, teardown.Target{Expect: link.Expect{Index: t.Index, Name: t.Name, Alias: t.Alias}, Identity: t.Identity})
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
		}
		return failures("DEL", out)
	})
}

// clearGone clears what ADD registered for the identity when its tap is
// already gone (deleted by something else): the rows whose ifindex_vrf row
// names the identity and whose ifindex has no link, and their pin.
func (p *Plugin) clearGone(ctx context.Context, e *env, inv *invocation) error {
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
	var own []link.Tap
	for _, t := range link.TenantTaps(links) {
		if inv.containerID != "" && t.Alias == inv.containerID {
			own = append(own, t)
		}
	}
	return own, nil
}

// Check verifies that the tap exists, is stamped by this container, is
// enslaved to its VRF and has its rows and program.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	return p.run(args, true, p.check)
}

func (p *Plugin) check(inv *invocation, e *env) error {
	ctx := context.Background()
	fail := func(format string, a ...any) error {
		return types.NewError(ErrCheckFailed, fmt.Sprintf(format, a...), "")
	}
	name := inv.identity.TapName()
	l, err := e.conn.GetByName(ctx, name)
	if errors.Is(err, link.ErrLinkGone) {
		return fail("tap %s does not exist", name)
	}
	if err != nil {
		return err
	}
	if l.Alias != inv.containerID {
		return fail("tap %s is stamped %q, not by container %s", name, l.Alias, inv.containerID)
	}
	master, err := e.conn.Get(ctx, l.Master)
	if l.Master == 0 || err != nil || master.Name != inv.identity.VRFName() {
		return fail("tap %s is not enslaved to its VRF %s", name, inv.identity.VRFName())
	}
	rows, err := e.reg.Rows(l.Index)
	if err != nil {
		return err
	}
	var missing []string
	for _, m := range []string{"ifindex_vrf", "traffic_policy", "egress_kind"} {
		if _, ok := rows.Rows[m]; !ok {
			missing = append(missing, m)
		}
	}
	if !rows.Attached {
		missing = append(missing, "tcx program")
	}
	if len(missing) > 0 {
		return fail("tap %s (ifindex %d) lacks its %s", name, l.Index, strings.Join(missing, ", "))
	}
	return nil
}

// GC removes tenant taps stamped by a container that cni.dev/valid-attachments
// does not list, when nothing holds them, through the one teardown path
// (the same locks, rechecks and order as the reclaim). It keeps going on errors
// and reports them all. Unstamped taps are never touched. A container listed
// with any interface keeps all its taps: the stamp records the container,
// not the interface name.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	return p.run(args, false, p.gc)
}

func (p *Plugin) gc(inv *invocation, e *env) error {
	ctx := context.Background()
	valid := map[string]bool{}
	for _, a := range inv.conf.ValidAttachments {
		valid[a.ContainerID] = true
	}
	links, err := e.conn.Links(ctx)
	if err != nil {
		return err
	}
	var targets []teardown.Target
	for _, t := range link.TenantTaps(links) {
		if !t.Stamped() || valid[t.Alias] {
			continue
		}
		targets = append(targets, teardown.Target{Expect: link.Expect{Index: t.Index, Name: t.Name, Alias: t.Alias}, Identity: t.Identity})
	}
	if len(targets) == 0 {
		return nil
	}
	out := e.remover(p.Log).Remove(ctx, targets, teardown.Options{Dump: links})
	p.Log.Info("GC", "candidates", len(targets), "removed", len(out.Removed), "kept", len(out.Kept), "failed", len(out.Failed))
	return failures("GC", out)
}

// Status reports ready when the eBPF maps load and the lock folder is
// writable; otherwise CNI error 50, plugin not available.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	inv, err := parse(args, false)
	if err != nil {
		return cniError(err)
	}
	unavailable := func(err error) error {
		return types.NewError(types.ErrPluginNotAvailable, "galactic-tap not available", err.Error())
	}
	dp, err := datapath.Load(inv.conf.BPFFS)
	if err != nil {
		return unavailable(err)
	}
	dp.Close()
	if err := os.MkdirAll(inv.conf.VRFLockDir, 0o700); err != nil {
		return unavailable(err)
	}
	f, err := os.CreateTemp(inv.conf.VRFLockDir, ".status-*")
	if err != nil {
		return unavailable(fmt.Errorf("lock folder %s not writable: %w", inv.conf.VRFLockDir, err))
	}
	f.Close()
	_ = os.Remove(f.Name())
	return nil
}
