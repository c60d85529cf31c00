package cnitap

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// GC removes this network's taps whose attachment, the pair (container ID,
// interface name) ADD recorded, cni.dev/valid-attachments does not list,
// when nothing holds them, through the one teardown path (the same locks,
// rechecks and order as the reclaim). It keeps going on errors and reports
// them all. Only taps this network's ADD recorded are considered, and the
// one tap of the identity its configuration names when no network recorded
// it (unrecordedTap: made by a plugin older than the records). Another
// network's, an unstamped one, or an unrecorded one of an identity given
// per container (args.cni, CNI_ARGS) are left to their own network and to
// the reclaim. A request with no list at all removes nothing, and says so.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	return p.run(args, cmdGC, p.gc)
}

type attachment struct{ containerID, ifName string }

func (p *Plugin) gc(inv *invocation, e *env) error {
	ctx := context.Background()
	if !inv.gcListed {
		p.Log.Warn("GC without cni.dev/valid-attachments removes nothing", "network", inv.conf.Name)
		return nil
	}
	valid := map[attachment]bool{}
	ifNames := map[string][]string{} // by container
	for _, a := range inv.conf.ValidAttachments {
		valid[attachment{a.ContainerID, a.IfName}] = true
		ifNames[a.ContainerID] = append(ifNames[a.ContainerID], a.IfName)
	}
	records, err := p.readRecords(inv)
	if err != nil {
		return err
	}
	if dir, err := networkDir(inv.conf.DataDir, inv.conf.Name); err == nil {
		// Under each tap's VPC lock any temp file is a dead writer's
		// (removeTemps): no age is waited for.
		removed, err := collectTemps(ctx, dir, e.locks, lockTimeout, 0)
		if len(removed) > 0 {
			p.Log.Info("GC removed temp files of record writers killed before their rename", "network", inv.conf.Name, "files", removed)
		}
		if err != nil {
			p.Log.Warn("GC left temp files of killed record writers", "network", inv.conf.Name, "error", err)
		}
	}
	var targets []teardown.TapRef
	var opts teardown.Options
	if inv.hasIdentity {
		t, ok, err := p.unrecordedTap(ctx, inv, e, ifNames)
		if err != nil {
			return err
		}
		if ok {
			targets = append(targets, teardown.RefOf(t))
			opts.Recheck = stillUnrecorded{dataDir: inv.conf.DataDir, tap: t.Name}
		}
	}
	for _, r := range records {
		if valid[attachment{r.ContainerID, r.IfName}] {
			continue
		}
		l, err := e.conn.GetByName(ctx, r.Tap)
		if errors.Is(err, link.ErrLinkGone) {
			_ = removeRecord(inv.conf.DataDir, inv.conf.Name, r.Tap)
			continue
		}
		if err != nil {
			return err
		}
		t, ok := l.AsTap()
		if !ok || t.Owner() != r.ContainerID {
			// Restamped since (a takeover by another container): the
			// record no longer speaks for the tap.
			p.Log.Info("GC drops a record the tap no longer matches", "network", inv.conf.Name, "tap", r.Tap, "recorded", r.ContainerID, "stamp", l.Alias)
			_ = removeRecord(inv.conf.DataDir, inv.conf.Name, r.Tap)
			continue
		}
		targets = append(targets, teardown.RefOf(t))
	}
	if len(targets) == 0 {
		return nil
	}
	out := e.remover(p.Log).Remove(ctx, targets, opts)
	for _, t := range out.Removed {
		if err := removeRecord(inv.conf.DataDir, inv.conf.Name, t.Name); err != nil {
			p.Log.Warn("GC left a record", "tap", t.Name, "error", err)
		}
	}
	p.Log.Info("GC", "network", inv.conf.Name, "candidates", len(targets), "removed", len(out.Removed), "kept", len(out.Kept), "failed", len(out.Failed))
	return failures("GC", out)
}

// unrecordedTap finds the tap of the identity this network's configuration
// names when it is stamped and no network holds a record of it: a plugin
// older than the records made it, so no GC would ever see it, and the
// reclaim keeps it while its identity lives on another node (a migrated
// VM's). The identity names one tap, and a network whose configuration
// names that identity is the one that made it. When its stamp is a
// container this network still lists, the tap gets its record (adopted:
// from then on it is an ordinary recorded tap); when not, it is returned
// for removal, through the teardown, which keeps it while held.
func (p *Plugin) unrecordedTap(ctx context.Context, inv *invocation, e *env, ifNames map[string][]string) (link.Tap, bool, error) {
	name := inv.identity.TapName()
	l, err := e.conn.GetByName(ctx, name)
	if errors.Is(err, link.ErrLinkGone) {
		return link.Tap{}, false, nil
	}
	if err != nil {
		return link.Tap{}, false, err
	}
	t, ok := l.AsTap()
	if !ok || !t.Stamped() {
		return link.Tap{}, false, nil
	}
	recs, err := recordsOfTap(inv.conf.DataDir, name)
	if err != nil || len(recs) > 0 {
		return link.Tap{}, false, err
	}
	switch names := ifNames[t.Owner()]; len(names) {
	case 0:
		p.Log.Info("GC found a tap made before records whose container this network no longer lists", "network", inv.conf.Name, "tap", name, "stamp", t.Owner())
		return t, true, nil
	case 1:
		if err := p.adopt(ctx, inv, e, t, names[0]); err != nil {
			return link.Tap{}, false, err
		}
	default:
		// Which of its interfaces the tap is cannot be told: it stays
		// unrecorded, and is kept.
		p.Log.Warn("GC keeps a tap made before records: its container has several interfaces on this network", "network", inv.conf.Name, "tap", name, "stamp", t.Owner())
	}
	return link.Tap{}, false, nil
}

// adopt records t, made before records, for this network's ifName. It
// writes under t's VPC lock, as ADD does: a writer's temp file seen under
// the lock is then always a dead writer's (removeTemps), and an ADD that
// recorded t since GC looked is not overwritten.
func (p *Plugin) adopt(ctx context.Context, inv *invocation, e *env, t link.Tap, ifName string) error {
	lctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	unlock, err := e.locks.Lock(lctx, inv.identity.VPC)
	if err != nil {
		return fmt.Errorf("adopt tap %s made before records: %w", t.Name, err)
	}
	defer unlock()
	if recs, err := recordsOfTap(inv.conf.DataDir, t.Name); err != nil || len(recs) > 0 {
		return err
	}
	r := record{Tap: t.Name, ContainerID: t.Owner(), IfName: ifName, HostNetNS: p.hostNetNS(e)}
	if err := writeRecord(inv.conf.DataDir, inv.conf.Name, r); err != nil {
		return fmt.Errorf("adopt tap %s made before records: %w", t.Name, err)
	}
	p.Log.Info("GC recorded a tap made before records", "network", inv.conf.Name, "tap", t.Name, "container", t.Owner(), "ifName", ifName)
	return nil
}

// stillUnrecorded keeps an unrecorded tap that an ADD has recorded since
// GC read the records: ADD writes its record under the VPC lock the
// teardown rechecks under.
type stillUnrecorded struct{ dataDir, tap string }

func (s stillUnrecorded) Recheck(context.Context) error { return nil }

func (s stillUnrecorded) KeepWhy(t teardown.TapRef) string {
	if t.Name != s.tap {
		return ""
	}
	recs, err := recordsOfTap(s.dataDir, s.tap)
	switch {
	case err != nil:
		return "its records cannot be read: " + err.Error()
	case len(recs) > 0:
		return "recorded by network " + recs[0].Network + " since GC read the records"
	}
	return ""
}
