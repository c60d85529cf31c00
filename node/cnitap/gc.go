package cnitap

import (
	"context"
	"errors"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// GC removes this network's taps whose attachment, the pair (container ID,
// interface name) ADD recorded, cni.dev/valid-attachments does not list,
// when nothing holds them, through the one teardown path (the same locks,
// rechecks and order as the reclaim). It keeps going on errors and reports
// them all. Only taps this network's ADD recorded are considered: another
// network's, an unstamped one, or one made before records existed are left
// to their own network and to the reclaim. A request with no list at all
// removes nothing, and says so.
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
	for _, a := range inv.conf.ValidAttachments {
		valid[attachment{a.ContainerID, a.IfName}] = true
	}
	records, err := p.readRecords(inv)
	if err != nil {
		return err
	}
	var targets []teardown.TapRef
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
	out := e.remover(p.Log).Remove(ctx, targets, teardown.Options{})
	for _, t := range out.Removed {
		if err := removeRecord(inv.conf.DataDir, inv.conf.Name, t.Name); err != nil {
			p.Log.Warn("GC left a record", "tap", t.Name, "error", err)
		}
	}
	p.Log.Info("GC", "network", inv.conf.Name, "candidates", len(targets), "removed", len(out.Removed), "kept", len(out.Kept), "failed", len(out.Failed))
	return failures("GC", out)
}
