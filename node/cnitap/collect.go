package cnitap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// Links reads this namespace's links; *link.Conn implements it.
type Links interface {
	Links(ctx context.Context) ([]link.Link, error)
	GetByName(ctx context.Context, name string) (link.Link, error)
}

// Collected is one record the collector removed, and why.
type Collected struct {
	Network, Tap, ContainerID string
	Why                       string
}

// CollectRecords removes the records, in every network's folder under
// dataDir, that no longer speak for a tap: the tap is gone, or another
// container has since stamped it. A network's own GC does this for its
// records, but a network whose config was removed (a deleted
// NetworkAttachmentDefinition) never sees a GC again, so the node daemon
// runs this. One link dump finds the records that look stale, so a round
// over live records takes no lock; each of those is judged again under its
// VPC's lock, which ADD holds
// from creating the tap to writing the record, so a record found stale
// there cannot be one an ADD is about to make true. A record that does not
// parse or does not name a tap is left for its network's GC and DEL, which
// move it aside. A missing dataDir is no error: nothing was ever recorded.
func CollectRecords(ctx context.Context, dataDir string, links Links, locks teardown.Locker, lockTimeout time.Duration, log *slog.Logger) ([]Collected, error) {
	networks, err := os.ReadDir(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("collect records: %w", err)
	}
	dump, err := links.Links(ctx)
	if err != nil {
		return nil, fmt.Errorf("collect records: %w", err)
	}
	byName := make(map[string]link.Link, len(dump))
	for _, l := range dump {
		byName[l.Name] = l
	}
	var done []Collected
	var errs []error
	for _, n := range networks {
		if !n.IsDir() || strings.HasPrefix(n.Name(), ".") {
			continue
		}
		records, unreadable, err := readRecords(dataDir, n.Name())
		if len(unreadable) > 0 {
			log.Warn("records that do not parse were moved aside", "network", n.Name(), "count", len(unreadable), "records", unreadable)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range records {
			if l, ok := byName[r.Tap]; staleWhy(l, ok, r) == "" {
				continue
			}
			if err := ctx.Err(); err != nil {
				return done, errors.Join(append(errs, err)...)
			}
			c, err := collectOne(ctx, dataDir, n.Name(), r, links, locks, lockTimeout)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if c != nil {
				log.Info("collected a record that no longer speaks for a tap", "network", c.Network, "tap", c.Tap, "container", c.ContainerID, "why", c.Why)
				done = append(done, *c)
			}
		}
		strays, err := collectTemps(ctx, filepath.Join(dataDir, n.Name()), locks, lockTimeout, minTempAge)
		if len(strays) > 0 {
			log.Info("removed temp files of record writers killed before their rename", "network", n.Name(), "files", strays)
		}
		if err != nil {
			errs = append(errs, err)
		}
		// An empty folder is a gone network's last trace; rmdir leaves
		// one that holds anything, and an ADD racing it makes the folder
		// again (writeRecord).
		_ = os.Remove(filepath.Join(dataDir, n.Name()))
	}
	return done, errors.Join(errs...)
}

// minTempAge is how old a temp file must be before the collection takes it
// for a dead writer's. Under the tap's VPC lock any temp file is one
// (removeTemps), but the daemon's lock folder is its own flag while the
// plugin's comes from its network's config: if they differ, the daemon's
// lock excludes no ADD. A live writer's temp file lives for milliseconds,
// so one older than this is a dead writer's whichever lock was held.
const minTempAge = time.Minute

// collectTemps removes the temp files in dir, at least minAge old, of
// writers killed before their rename, each under its tap's VPC lock, as
// collectOne takes it.
func collectTemps(ctx context.Context, dir string, locks teardown.Locker, lockTimeout, minAge time.Duration) ([]string, error) {
	byTap, err := tempsIn(dir)
	if err != nil {
		return nil, fmt.Errorf("collect temp files: %w", err)
	}
	var removed []string
	var errs []error
	for tap, paths := range byTap {
		id, err := identity.ParseTapName(tap)
		if err != nil {
			continue // no writer of this plugin made it: left for an operator
		}
		r, err := collectTempsOf(ctx, id.VPC, paths, locks, lockTimeout, minAge)
		removed = append(removed, r...)
		if err != nil {
			errs = append(errs, fmt.Errorf("collect temp files of tap %s: %w", tap, err))
		}
	}
	return removed, errors.Join(errs...)
}

func collectTempsOf(ctx context.Context, vpc identity.VPC, paths []string, locks teardown.Locker, lockTimeout, minAge time.Duration) ([]string, error) {
	lctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	unlock, err := locks.Lock(lctx, vpc)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var dead []string
	for _, p := range paths {
		if fi, err := os.Lstat(p); err == nil && time.Since(fi.ModTime()) >= minAge {
			dead = append(dead, p)
		}
	}
	return removeTemps(dead)
}

func collectOne(ctx context.Context, dataDir, network string, r record, links Links, locks teardown.Locker, lockTimeout time.Duration) (*Collected, error) {
	id, err := identity.ParseTapName(r.Tap)
	if err != nil {
		return nil, nil // not a tap this plugin names; its network's DEL and GC judge it
	}
	lctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	unlock, err := locks.Lock(lctx, id.VPC)
	if err != nil {
		return nil, fmt.Errorf("collect record %s/%s: %w", network, r.Tap, err)
	}
	defer unlock()
	// Read again under the lock: an ADD may have rewritten it since.
	now, err := readRecord(dataDir, network, r.Tap)
	if err != nil || now != r {
		return nil, err
	}
	l, err := links.GetByName(ctx, r.Tap)
	if err != nil && !errors.Is(err, link.ErrLinkGone) {
		return nil, fmt.Errorf("collect record %s/%s: %w", network, r.Tap, err)
	}
	why := staleWhy(l, err == nil, r)
	if why == "" {
		return nil, nil
	}
	if err := removeRecord(dataDir, network, r.Tap); err != nil {
		return nil, fmt.Errorf("collect record %s/%s: %w", network, r.Tap, err)
	}
	return &Collected{Network: network, Tap: r.Tap, ContainerID: r.ContainerID, Why: why}, nil
}

// staleWhy says why r no longer speaks for its tap l (found false: there is
// none), or "" while it does.
func staleWhy(l link.Link, found bool, r record) string {
	switch {
	case !found:
		return "tap gone"
	case l.Alias != "" && l.Alias != r.ContainerID:
		return "tap stamped by container " + l.Alias
	}
	return ""
}
