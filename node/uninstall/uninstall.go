// Package uninstall cleans a node of what galactic leaves on it once the
// cluster no longer runs it (its manifests deleted): tenant taps nothing
// uses, the CNI plugin, the operator CLI, the daemon's seccomp profile,
// the pinned eBPF maps and programs, the plugin's records, the layout
// record, the VRF locks and the brake's memory.
//
// The rules a caller must know. Nothing changes while a daemon answers on
// the admin socket or runs in this network namespace, while the paths hold
// none of galactic's state although the node has its taps (a wrong host
// root), or when a folder to be removed whole is not named for galactic. A
// tap is removed only through node/teardown, the path CNI DEL takes, and
// only if no process holds it (the kernel probe decides) and no process on
// the node is in a cgroup named after the pod sandbox its ADD was for (its
// owner stamp). Any other tap is kept, and with it everything that serves
// it: the plugin the runtime will exec to DEL it, the pins holding its
// program and rows, the records and locks that plugin reads. Run then
// reports the taps kept and why, and ErrKept; run it again once they are
// gone. The plugin is set aside before the rest goes, plugin invocations
// already running are waited for, and it is put back if a tap appeared
// meanwhile. Each step is idempotent: a second run finds nothing and says
// so.
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
	"syscall"
	"time"

	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// Sentinel errors a caller branches on.
var (
	// ErrDaemonRunning: a daemon answers on the admin socket, or runs in
	// this network namespace; nothing was changed.
	ErrDaemonRunning = errors.New("a galactic-node daemon still runs on this node")
	// ErrKept: some taps are still in use and were kept, and with them
	// the plugin, pins, records and locks.
	ErrKept = errors.New("taps still in use were kept, and what serves them")
	// ErrNotThisNode: the paths hold nothing of galactic's, yet the node
	// has its taps: the host root or a path flag is wrong. Nothing was
	// changed.
	ErrNotThisNode = errors.New("the paths given hold none of galactic's state, yet this node has its taps")
	// ErrUnsafePath: a folder to be removed whole is not named for
	// galactic. Nothing was changed.
	ErrUnsafePath = errors.New("a folder to remove whole is not galactic's")
)

// Paths are where an install put things on the node, under Root. An empty
// path is skipped.
type Paths struct {
	Root          string // the node's root filesystem, as this process sees it ("/", or /host in a debug pod)
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

// pluginWait bounds the wait for plugin invocations that started before
// the plugin was set aside.
const pluginWait = 30 * time.Second

// Config is one uninstall.
type Config struct {
	Paths
	// Links lists the node's links; Remover removes taps through the
	// one teardown, its prober proving each free.
	Links     teardown.Links
	Remover   *teardown.Remover
	Processes Processes
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

// Empty reports whether the run found nothing of galactic's.
func (r Report) Empty() bool {
	return len(r.TapsRemoved)+len(r.TapsKept)+len(r.TapsFailed)+len(r.Removed) == 0
}

// Run cleans the node as the package says, and reports what it did. It
// returns ErrDaemonRunning, ErrNotThisNode, ErrUnsafePath or ErrKept
// (wrapped, with what and why) when it stopped short.
func Run(ctx context.Context, c Config) (Report, error) {
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rep := Report{DryRun: c.DryRun}
	for _, dir := range []string{c.PinDir, c.CNIDataDir, c.VRFLockDir} {
		if dir != "" && !c.galactics(dir) {
			return rep, fmt.Errorf("%w: %s would be removed with all it holds; name a folder of galactic's", ErrUnsafePath, dir)
		}
	}
	taps, err := tenantTaps(ctx, c.Links)
	if err != nil {
		return rep, err
	}
	if len(taps) > 0 && !c.anyState() {
		return rep, fmt.Errorf("%w (%d taps; none of %s): is the host root right?", ErrNotThisNode, len(taps), strings.Join(c.stateDirs(), ", "))
	}
	if c.AdminSocket != "" {
		up, err := answers(ctx, c.AdminSocket)
		if err != nil {
			return rep, fmt.Errorf("%w: whether one answers on %s cannot be told: %w", ErrDaemonRunning, c.AdminSocket, err)
		}
		if up {
			return rep, fmt.Errorf("%w: %s answers; delete galactic from the cluster first (docs/operations.md, Uninstall)", ErrDaemonRunning, c.AdminSocket)
		}
	}
	view, err := c.Processes.Look(ctx)
	if err != nil {
		return rep, err
	}
	if len(view.Daemons) > 0 {
		return rep, fmt.Errorf("%w: process %d runs galactic-node run in this network namespace; delete galactic from the cluster first (docs/operations.md, Uninstall)", ErrDaemonRunning, view.Daemons[0])
	}

	plugin := join(c.CNIBinDir, PluginName)
	aside := join(c.CNIBinDir, "."+PluginName+".uninstalling")
	if plugin != "" && !c.DryRun {
		// A run killed after it set the plugin aside left it there.
		if _, err := os.Lstat(plugin); errors.Is(err, fs.ErrNotExist) {
			if err := os.Rename(aside, plugin); err == nil {
				log.Info("put back the plugin an interrupted uninstall set aside", "path", plugin)
			}
		}
	}

	removeTaps(ctx, c, taps, view, &rep, log)
	if len(rep.TapsKept) > 0 || len(rep.TapsFailed) > 0 {
		return rep, keptError(rep)
	}

	if plugin != "" && !c.DryRun {
		// The plugin goes first, aside, so that no runtime starts it
		// anew; invocations already running are waited for, and a tap
		// one made meanwhile is found by the second look, and the plugin
		// put back for it.
		if err := os.Rename(plugin, aside); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return rep, fmt.Errorf("move the plugin %s aside: %w", plugin, err)
		}
		late, err := c.afterPlugins(ctx)
		if err != nil || len(late) > 0 {
			if rerr := os.Rename(aside, plugin); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = errors.Join(err, fmt.Errorf("put the plugin %s back: %w", plugin, rerr))
			}
			if err != nil {
				return rep, err
			}
			for _, t := range late {
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
		removed, err := removeLeftovers(plugin, false)
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
		} else if err := remove(p.path, p.all); errors.Is(err, fs.ErrNotExist) {
			rep.Absent = append(rep.Absent, p.path)
		} else if err != nil {
			errs = append(errs, err)
		} else {
			rep.Removed = append(rep.Removed, p.path)
			log.Info("removed", "path", p.path)
		}
		if !p.all {
			removed, err := removeLeftovers(p.path, c.DryRun)
			rep.Removed = append(rep.Removed, removed...)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	// The folders install-cni and the daemon made (/opt/galactic/bin,
	// /run/galactic, /var/lib/galactic/node, ...), once empty: only
	// folders whose path under the root names galactic, so that a flag
	// pointed elsewhere never takes an empty folder of the system's.
	if !c.DryRun {
		for _, dir := range []string{c.CLIDir, c.SeccompDir, dirOf(c.LayoutRecord), dirOf(c.AdminSocket), dirOf(c.BrakeMemory)} {
			if dir == "" || !c.galactics(dir) {
				continue
			}
			// The folder itself (/opt/galactic/bin), then each parent
			// named for galactic (/opt/galactic).
			for first := true; c.galactics(dir) && (first || strings.Contains(filepath.Base(dir), "galactic")); dir, first = dirOf(dir), false {
				if os.Remove(dir) != nil {
					break
				}
				rep.Removed = append(rep.Removed, dir)
			}
		}
	}
	return rep, errors.Join(errs...)
}

// galactics reports whether path, below the root, names galactic.
func (c Config) galactics(path string) bool {
	rel, err := filepath.Rel(c.root(), path)
	return err == nil && !strings.HasPrefix(rel, "..") && strings.Contains(rel, "galactic")
}

func (c Config) root() string {
	if c.Root == "" {
		return "/"
	}
	return c.Root
}

// stateDirs are where a node galactic ran on keeps state while it has taps.
func (c Config) stateDirs() []string {
	var dirs []string
	for _, d := range []string{c.PinDir, c.CNIDataDir, c.VRFLockDir, dirOf(c.LayoutRecord)} {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

func (c Config) anyState() bool {
	for _, d := range c.stateDirs() {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// afterPlugins waits for the plugin invocations running in this network
// namespace to end, then lists the taps again: any is one made meanwhile.
func (c Config) afterPlugins(ctx context.Context) ([]link.Tap, error) {
	deadline := time.Now().Add(pluginWait)
	for {
		view, err := c.Processes.Look(ctx)
		if err != nil {
			return nil, err
		}
		if len(view.Plugins) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("galactic-tap (process %d) still runs after %s: run again once the runtime is done with it", view.Plugins[0], pluginWait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return tenantTaps(ctx, c.Links)
}

// removeTaps removes every tenant tap that is not in use, and reports each.
// A tap that went by itself meanwhile is neither removed nor kept; one
// whose link went but whose rows could not all be cleared is removed (its
// rows go with the pin folder).
func removeTaps(ctx context.Context, c Config, taps []link.Tap, view ProcessView, rep *Report, log *slog.Logger) {
	var targets []teardown.TapRef
	for _, t := range taps {
		ref := teardown.RefOf(t)
		switch {
		case !t.Stamped():
			rep.TapsKept = append(rep.TapsKept, teardown.Kept{Tap: ref, Why: "it carries no owner stamp, so no sandbox can be told gone"})
		case view.SandboxRuns(ref.Owner):
			rep.TapsKept = append(rep.TapsKept, teardown.Kept{Tap: ref, Why: "its pod sandbox " + ref.Owner + " still has processes on the node: delete the pod first"})
		default:
			targets = append(targets, ref)
		}
	}
	if len(targets) == 0 {
		return
	}
	out := c.Remover.Remove(ctx, targets, teardown.Options{DryRun: c.DryRun})
	rep.TapsRemoved = append(rep.TapsRemoved, out.Removed...)
	rep.TapsRemoved = append(rep.TapsRemoved, out.WouldRemove...)
	for _, k := range out.Kept {
		if strings.HasPrefix(k.Why, "gone before") {
			continue
		}
		rep.TapsKept = append(rep.TapsKept, k)
	}
	for _, f := range out.Failed {
		if f.Stage == teardown.StageRows {
			log.Warn("removed tap's rows go with the pin folder", "tap", f.Tap.Name, "error", f.Error)
			continue
		}
		rep.TapsFailed = append(rep.TapsFailed, f)
	}
	for _, t := range out.Removed {
		log.Info("removed tap", "tap", t.Name, "ifindex", t.Ifindex, "owner", t.Owner)
	}
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
// Only a socket that is not there, or that nothing listens on, says no
// daemon; any other failure (a full backlog, a refused permission) is an
// error, since a daemon may be behind it.
func answers(ctx context.Context, socket string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err == nil {
		conn.Close()
		return true, nil
	}
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return false, nil
	}
	return false, err
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
func removeLeftovers(path string, dryRun bool) ([]string, error) {
	var removed []string
	var errs []error
	dir, base := filepath.Dir(path), filepath.Base(path)
	for _, pattern := range []string{"." + base + ".tmp-*", "." + base + "-*"} {
		matches, _ := filepath.Glob(filepath.Join(dir, globEscape(pattern)))
		for _, m := range matches {
			if dryRun {
				removed = append(removed, m)
				continue
			}
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
