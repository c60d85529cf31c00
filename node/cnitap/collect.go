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
)

// LinkGetter reads one link by name; *link.Conn implements it.
type LinkGetter interface {
	GetByName(ctx context.Context, name string) (link.Link, error)
}

// VPCLocker takes a VPC's VRF lock; *vrf.Locker implements it.
type VPCLocker interface {
	Lock(ctx context.Context, vpc identity.VPC) (unlock func(), err error)
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
// runs this. Each record is judged under its VPC's lock, which ADD holds
// from creating the tap to writing the record, so a record found stale
// there cannot be one an ADD is about to make true. A record that does not
// parse or does not name a tap is left for its network's GC and DEL, which
// move it aside. A missing dataDir is no error: nothing was ever recorded.
func CollectRecords(ctx context.Context, dataDir string, links LinkGetter, locks VPCLocker, lockTimeout time.Duration, log *slog.Logger) ([]Collected, error) {
	networks, err := os.ReadDir(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("collect records: %w", err)
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
		// An empty folder is a gone network's last trace; rmdir leaves
		// one that holds anything, and an ADD racing it makes the folder
		// again (writeRecord).
		_ = os.Remove(filepath.Join(dataDir, n.Name()))
	}
	return done, errors.Join(errs...)
}

func collectOne(ctx context.Context, dataDir, network string, r record, links LinkGetter, locks VPCLocker, lockTimeout time.Duration) (*Collected, error) {
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
	var why string
	l, err := links.GetByName(ctx, r.Tap)
	switch {
	case errors.Is(err, link.ErrLinkGone):
		why = "tap gone"
	case err != nil:
		return nil, fmt.Errorf("collect record %s/%s: %w", network, r.Tap, err)
	case l.Alias != "" && l.Alias != r.ContainerID:
		why = "tap stamped by container " + l.Alias
	default:
		return nil, nil
	}
	if err := removeRecord(dataDir, network, r.Tap); err != nil {
		return nil, fmt.Errorf("collect record %s/%s: %w", network, r.Tap, err)
	}
	return &Collected{Network: network, Tap: r.Tap, ContainerID: r.ContainerID, Why: why}, nil
}
