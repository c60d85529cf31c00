package cnitap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// Links reads the links of the namespace a collector judges records by;
// *link.Conn implements it.
type Links interface {
	Links(ctx context.Context) ([]link.Link, error)
	GetByName(ctx context.Context, name string) (link.Link, error)
	// NetNS names the namespace the links are read in, as a record's
	// HostNetNS does (link.Conn.NetNS).
	NetNS() (string, error)
}

// Collected is one record the collector removed, and why.
type Collected struct {
	Network, Tap, ContainerID string
	Why                       string
}

// Collection is what one CollectRecords call did.
type Collection struct {
	// Collected are the records it removed.
	Collected []Collected
	// Unjudged counts the records it left, stale-looking or not, because
	// nothing showed that it reads the namespace their taps were made in:
	// there a tap it cannot see may well be live. UnjudgedWhy says why in
	// one sentence, for a log and a status page; "" when Unjudged is 0.
	Unjudged    int
	UnjudgedWhy string
}

// CollectRecords removes the records, in every network's folder under
// dataDir, that no longer speak for a tap: the tap is gone, or another
// container has since stamped it. A network's own GC does this for its
// records, but a network whose config was removed (a deleted
// NetworkAttachmentDefinition) never sees a GC again, so the node daemon
// runs this. It judges only the records it has evidence it sees the
// namespace of: one that names its namespace (HostNetNS) as the one links
// reads, or, written before records named it, one whose VRF links shows. A
// daemon started in another namespace (a lab, a test, a demo) over the
// host's folder would otherwise take every live tap for gone; what it
// leaves is counted in the Collection and logged once. One link dump finds
// the records that look stale, so a round over live records takes no lock;
// each of those is judged again under its VPC's lock, which ADD holds from
// creating the tap to writing the record, so a record found stale there
// cannot be one an ADD is about to make true. A record that does not
// parse or does not name a tap is left for its network's GC and DEL, which
// move it aside. Temp files of writers killed before their rename go too
// (collectTemps), and then a folder left empty. A missing dataDir is no
// error: nothing was ever recorded.
func CollectRecords(ctx context.Context, dataDir string, links Links, locks teardown.Locker, lockTimeout time.Duration, log *slog.Logger) (res Collection, err error) {
	networks, err := os.ReadDir(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("collect records: %w", err)
	}
	dump, err := links.Links(ctx)
	if err != nil {
		return res, fmt.Errorf("collect records: %w", err)
	}
	ev := evidence{byName: make(map[string]link.Link, len(dump)), foreign: map[string]int{}, unseen: map[string]int{}}
	for _, l := range dump {
		ev.byName[l.Name] = l
	}
	ev.netns, ev.netnsErr = links.NetNS()
	defer func() { // on every return from here, also a cancelled one
		res.Unjudged, res.UnjudgedWhy = ev.why()
		if res.Unjudged > 0 {
			log.Warn("records left unjudged: "+res.UnjudgedWhy, "unjudged", res.Unjudged, "folder", dataDir)
		}
	}()
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
			if !ev.judges(r) {
				continue
			}
			if l, ok := ev.byName[r.Tap]; staleWhy(l, ok, r) == "" {
				continue
			}
			if err := ctx.Err(); err != nil {
				return res, errors.Join(append(errs, err)...)
			}
			c, err := collectOne(ctx, dataDir, n.Name(), r, links, locks, lockTimeout)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if c != nil {
				log.Info("collected a record that no longer speaks for a tap", "network", c.Network, "tap", c.Tap, "container", c.ContainerID, "why", c.Why)
				res.Collected = append(res.Collected, *c)
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
	return res, errors.Join(errs...)
}

// evidence tells which records a collector may judge: those whose taps
// were made in the namespace it reads links in. It counts the others.
type evidence struct {
	netns    string // the collector's namespace; "" when it cannot be told
	netnsErr error
	byName   map[string]link.Link
	foreign  map[string]int // records by the other namespace they name
	unseen   map[string]int // records naming no namespace, by their VRF, not in byName
}

func (ev *evidence) judges(r record) bool {
	if r.HostNetNS != "" {
		if r.HostNetNS == ev.netns {
			return true
		}
		ev.foreign[r.HostNetNS]++
		return false
	}
	id, err := identity.ParseTapName(r.Tap)
	if err != nil {
		return true // not a tap this plugin names: collectOne leaves it
	}
	// ADD makes a tap's VRF (or the bridge standing in for one, named
	// the same) in the tap's namespace and no one deletes it with the
	// tap: seeing it says this is that namespace.
	if _, ok := ev.byName[id.VRFName()]; ok {
		return true
	}
	ev.unseen[id.VRFName()]++
	return false
}

// why counts the records left unjudged and says why in one sentence.
func (ev *evidence) why() (int, string) {
	var parts []string
	total := 0
	if n, names := tally(ev.foreign); n > 0 {
		total += n
		here := ev.netns
		if here == "" {
			here = "a network namespace it cannot name (" + ev.netnsErr.Error() + ")"
		}
		parts = append(parts, fmt.Sprintf("%s written in network namespace %s; this collector is in %s", records(n), names, here))
	}
	if n, names := tally(ev.unseen); n > 0 {
		total += n
		parts = append(parts, fmt.Sprintf("%s written without their network namespace, for VRFs this collector does not see (%s)", records(n), names))
	}
	if total == 0 {
		return 0, ""
	}
	return total, strings.Join(parts, "; ") + ": they are not its to judge"
}

// tally sums the counts of m and lists its keys, the first few.
func tally(m map[string]int) (int, string) {
	const shown = 5
	n := 0
	keys := make([]string, 0, len(m))
	for k, c := range m {
		n += c
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) > shown {
		keys = append(keys[:shown], fmt.Sprintf("and %d more", len(keys)-shown))
	}
	return n, strings.Join(keys, ", ")
}

func records(n int) string {
	if n == 1 {
		return "1 record was"
	}
	return strconv.Itoa(n) + " records were"
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
