// Package uninstall cleans a node of what galactic leaves on it once the
// cluster no longer runs it (its manifests deleted): tenant taps nothing
// uses, the CNI plugin, the operator CLI, the daemon's seccomp profile,
// the pinned eBPF maps and programs, the plugin's records, the layout
// record, the VRF locks and the brake's memory.
//
// The rules a caller must know. Nothing changes while a daemon answers on
// the admin socket. A tap is removed only through node/teardown, the path
// CNI DEL takes, and only if no process holds it (the kernel probe decides)
// and the pod sandbox its ADD was for (its owner stamp) has no process left
// on the node. Any other tap is kept, and with it everything that serves it:
// the plugin the runtime will exec to DEL it, the pins holding its program
// and rows, the records and locks that plugin reads. Run then reports the
// taps kept and why, and ErrKept; run it again once they are gone. Each
// step is idempotent: a second run finds nothing and says so.
package uninstall

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// Sentinel errors a caller branches on.
var (
	// ErrDaemonRunning: a daemon answers on the admin socket; nothing
	// was changed.
	ErrDaemonRunning = errors.New("a galactic-node daemon still runs on this node")
	// ErrKept: some taps are still in use and were kept, and with them
	// the plugin, pins, records and locks.
	ErrKept = errors.New("taps still in use were kept, and what serves them")
)

// Paths are where an install put things on the node. An empty path is
// skipped.
type Paths struct {
	AdminSocket   string // the daemon's socket: answering, nothing is done
	CNIBinDir     string // holds the plugin, galactic-tap
	CLIDir        string // holds the CLI, galactic-node
	SeccompDir    string // holds the daemon's profile, galactic-node.json
	MultusConfDir string // holds the conflist install-cni put there, 10-galactic.conflist
	PinDir        string // the pinned maps, programs and links: removed whole
	LayoutRecord  string
	CNIDataDir    string // the plugin's records: removed whole
	VRFLockDir    string // removed whole
	BrakeMemory   string
}

// The files install-cni writes, by name.
const (
	PluginName   = "galactic-tap"
	CLIName      = "galactic-node"
	SeccompName  = "galactic-node.json"
	ConflistName = "10-galactic.conflist"
)

// Sandboxes tells whether a pod sandbox still has processes on the node.
type Sandboxes interface {
	Running(ctx context.Context, owner string) (bool, error)
}

// Config is one uninstall.
type Config struct {
	Paths
	// Links lists the node's links; Remover removes taps through the
	// one teardown, its prober proving each free.
	Links     teardown.Links
	Remover   *teardown.Remover
	Sandboxes Sandboxes
	// DryRun reports what would be removed and changes nothing.
	DryRun bool
	Log    *slog.Logger
}

// Report is what Run did, or would do.
type Report struct {
	TapsRemoved []teardown.TapRef  `json:"tapsRemoved"`
	TapsKept    []teardown.Kept    `json:"tapsKept"`
	TapsFailed  []teardown.Failure `json:"tapsFailed"`
	// Removed are the host paths removed; Absent, those already gone.
	Removed []string `json:"removed"`
	Absent  []string `json:"absent"`
	DryRun  bool     `json:"dryRun,omitempty"`
}

// Run cleans the node as the package says, and reports what it did. It
// returns ErrDaemonRunning or ErrKept (wrapped, with what and why) when it
// stopped short.
func Run(ctx context.Context, c Config) (Report, error) {
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rep := Report{DryRun: c.DryRun}
	if c.AdminSocket != "" && answers(ctx, c.AdminSocket) {
		return rep, fmt.Errorf("%w: %s answers; delete galactic from the cluster first (docs/operations.md, Uninstall)", ErrDaemonRunning, c.AdminSocket)
	}

	if err := removeTaps(ctx, c, &rep, log); err != nil {
		return rep, err
	}
	if len(rep.TapsKept) > 0 || len(rep.TapsFailed) > 0 {
		return rep, keptError(rep)
	}

	// The plugin goes first, aside, so that no runtime starts it anew;
	// a tap an ADD made meanwhile is found by the second look, and the
	// plugin is put back for it.
	plugin := join(c.CNIBinDir, PluginName)
	aside := join(c.CNIBinDir, "."+PluginName+".uninstalling")
	if plugin != "" && !c.DryRun {
		if err := os.Rename(plugin, aside); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return rep, fmt.Errorf("move the plugin %s aside: %w", plugin, err)
		}
		taps, err := tenantTaps(ctx, c.Links)
		if err != nil || len(taps) > 0 {
			if rerr := os.Rename(aside, plugin); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = errors.Join(err, fmt.Errorf("put the plugin %s back: %w", plugin, rerr))
			}
			if err != nil {
				return rep, err
			}
			for _, t := range taps {
				rep.TapsKept = append(rep.TapsKept, teardown.Kept{Tap: teardown.RefOf(t), Why: "made while the uninstall ran"})
			}
			return rep, keptError(rep)
		}
		if err := os.Remove(aside); err == nil {
			rep.Removed = append(rep.Removed, plugin)
			log.Info("removed the CNI plugin", "path", plugin)
		} else if errors.Is(err, fs.ErrNotExist) {
			rep.Absent = append(rep.Absent, plugin)
		} else {
			return rep, fmt.Errorf("remove the plugin %s: %w", plugin, err)
		}
		removed, err := removeLeftovers(plugin)
		rep.Removed = append(rep.Removed, removed...)
		if err != nil {
			return rep, err
		}
	} else if plugin != "" {
		note(&rep, plugin)
	}

	var errs []error
	for _, p := range []struct {
		path string
		all  bool // a folder of galactic's own, removed with what it holds
	}{
		{join(c.CLIDir, CLIName), false},
		{join(c.SeccompDir, SeccompName), false},
		{join(c.MultusConfDir, ConflistName), false},
		{c.PinDir, true},
		{c.LayoutRecord, false},
		{c.CNIDataDir, true},
		{c.VRFLockDir, true},
		{c.AdminSocket, false},
		{c.BrakeMemory, false},
	} {
		if p.path == "" {
			continue
		}
		if c.DryRun {
			note(&rep, p.path)
			continue
		}
		if err := remove(p.path, p.all); errors.Is(err, fs.ErrNotExist) {
			rep.Absent = append(rep.Absent, p.path)
		} else if err != nil {
			errs = append(errs, err)
		} else {
			rep.Removed = append(rep.Removed, p.path)
			log.Info("removed", "path", p.path)
		}
		if !p.all {
			removed, err := removeLeftovers(p.path)
			rep.Removed = append(rep.Removed, removed...)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	// The folders install-cni and the daemon made (/opt/galactic/bin,
	// /run/galactic, /var/lib/galactic/node, ...), once empty: only
	// folders on a path that names galactic, so that a flag pointed
	// elsewhere never takes an empty folder of the system's with it.
	if !c.DryRun {
		for _, dir := range []string{c.CLIDir, c.SeccompDir, dirOf(c.LayoutRecord), dirOf(c.AdminSocket), dirOf(c.BrakeMemory)} {
			if !strings.Contains(dir, "galactic") {
				continue
			}
			// The folder itself (/opt/galactic/bin), then each parent
			// named for galactic (/opt/galactic).
			for first := true; dir != "" && (first || strings.Contains(filepath.Base(dir), "galactic")); dir, first = dirOf(dir), false {
				if os.Remove(dir) != nil {
					break
				}
				rep.Removed = append(rep.Removed, dir)
			}
		}
	}
	return rep, errors.Join(errs...)
}

// removeTaps removes every tenant tap that is not in use, and reports each.
func removeTaps(ctx context.Context, c Config, rep *Report, log *slog.Logger) error {
	taps, err := tenantTaps(ctx, c.Links)
	if err != nil {
		return err
	}
	var targets []teardown.TapRef
	for _, t := range taps {
		ref := teardown.RefOf(t)
		if !t.Stamped() {
			rep.TapsKept = append(rep.TapsKept, teardown.Kept{Tap: ref, Why: "it carries no owner stamp, so no sandbox can be told gone"})
			continue
		}
		running, err := c.Sandboxes.Running(ctx, ref.Owner)
		switch {
		case err != nil:
			rep.TapsKept = append(rep.TapsKept, teardown.Kept{Tap: ref, Why: "cannot tell whether its pod sandbox still runs: " + err.Error()})
		case running:
			rep.TapsKept = append(rep.TapsKept, teardown.Kept{Tap: ref, Why: "its pod sandbox " + ref.Owner + " still has processes on the node: delete the pod first"})
		default:
			targets = append(targets, ref)
		}
	}
	if len(targets) == 0 {
		return nil
	}
	out := c.Remover.Remove(ctx, targets, teardown.Options{DryRun: c.DryRun})
	rep.TapsRemoved = append(rep.TapsRemoved, out.Removed...)
	rep.TapsRemoved = append(rep.TapsRemoved, out.WouldRemove...)
	rep.TapsKept = append(rep.TapsKept, out.Kept...)
	rep.TapsFailed = append(rep.TapsFailed, out.Failed...)
	for _, t := range out.Removed {
		log.Info("removed tap", "tap", t.Name, "ifindex", t.Ifindex, "owner", t.Owner)
	}
	return nil
}

func tenantTaps(ctx context.Context, l teardown.Links) ([]link.Tap, error) {
	links, err := l.Links(ctx)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	return link.TenantTaps(links), nil
}

func keptError(rep Report) error {
	var parts []string
	for _, k := range rep.TapsKept {
		parts = append(parts, fmt.Sprintf("%s (ifindex %d): %s", k.Tap.Name, k.Tap.Ifindex, k.Why))
	}
	for _, f := range rep.TapsFailed {
		parts = append(parts, fmt.Sprintf("%s (ifindex %d): %s failed: %s", f.Tap.Name, f.Tap.Ifindex, f.Stage, f.Error))
	}
	slices.Sort(parts)
	return fmt.Errorf("%w: %s; run again once they are gone", ErrKept, strings.Join(parts, "; "))
}

// answers reports whether something accepts connections on the socket.
func answers(ctx context.Context, socket string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// remove removes a file, or with all a folder and what it holds; a folder
// without all is an error, never emptied.
func remove(path string, all bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() && all {
		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("remove %s: %w", path, err)
		}
		return nil
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// removeLeftovers removes what a writer of path killed mid-write left
// beside it: each writes a temp file in the same folder and renames it into
// place, named .<name>.tmp-* (install-cni, the brake's memory) or
// .<name>-* (the layout record).
func removeLeftovers(path string) ([]string, error) {
	var removed []string
	var errs []error
	dir, base := filepath.Dir(path), filepath.Base(path)
	for _, pattern := range []string{"." + base + ".tmp-*", "." + base + "-*"} {
		matches, _ := filepath.Glob(filepath.Join(dir, globEscape(pattern)))
		for _, m := range matches {
			if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove %s: %w", m, err))
				continue
			}
			removed = append(removed, m)
		}
	}
	return removed, errors.Join(errs...)
}

// globEscape escapes the glob metacharacters of a name's literal part.
func globEscape(pattern string) string {
	lit, star := strings.CutSuffix(pattern, "*")
	r := strings.NewReplacer(`\`, `\\`, "[", `\[`, "?", `\?`, "*", `\*`).Replace(lit)
	if star {
		r += "*"
	}
	return r
}

// note records what a dry run would remove.
func note(rep *Report, path string) {
	if _, err := os.Lstat(path); err == nil {
		rep.Removed = append(rep.Removed, path)
	} else {
		rep.Absent = append(rep.Absent, path)
	}
}

// dirOf is the folder holding path; empty for an empty path.
func dirOf(path string) string {
	if path == "" {
		return ""
	}
	return filepath.Dir(path)
}

func join(dir, name string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, name)
}
