package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/internal/cli"
	"github.com/datum-cloud/galactic-node/internal/logging"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/cnitap"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/reclaim/brakefile"
	"github.com/datum-cloud/galactic-node/node/teardown"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/node/uninstall"
	"github.com/datum-cloud/galactic-node/node/vrf"
)

const uninstallSynopsis = "galactic-node uninstall [--dry-run] [--host-root DIR] [-o json] [flags]"

type uninstallFlags struct {
	hostRoot, output                           string
	dryRun                                     bool
	adminSocket, cniBinDir, cliDir, seccompDir string
	multusConfDir, bpffs, layoutRecord         string
	cniDataDir, vrfLockDir, brakeMemory, proc  string
	logFormat, logLevel                        string
}

// uninstallFlagSet's defaults are the host paths the DaemonSet mounts and
// install-cni writes, as the node itself sees them: run it on the node, or
// from a privileged debug pod with --host-root /host.
func uninstallFlagSet(f *uninstallFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("galactic-node uninstall", flag.ContinueOnError)
	fs.BoolVar(&f.dryRun, "dry-run", false, "say what would be removed, and remove nothing")
	fs.StringVar(&f.hostRoot, "host-root", "/", "where the node's root filesystem is mounted (/host in a kubectl debug node pod); every path below is under it")
	fs.StringVar(&f.output, "o", "", "json: print the report as JSON")
	fs.StringVar(&f.adminSocket, "admin-socket", defaultAdminSocket, "the daemon's socket: while it answers, nothing is done")
	fs.StringVar(&f.cniBinDir, "cni-bin-dir", "/opt/cni/bin", "the folder holding the plugin, galactic-tap")
	fs.StringVar(&f.cliDir, "cli-dir", "/opt/galactic/bin", "the folder holding the CLI, galactic-node")
	fs.StringVar(&f.seccompDir, "seccomp-dir", "/var/lib/kubelet/seccomp/galactic", "the folder holding the daemon's seccomp profile")
	fs.StringVar(&f.multusConfDir, "multus-conf-dir", "", "Multus' folder, where install-cni --multus-conf-dir put 10-galactic.conflist (empty: none)")
	fs.StringVar(&f.bpffs, "bpffs", defaultBPFFS, "the bpf filesystem holding the pins, under galactic/")
	fs.StringVar(&f.layoutRecord, "layout-record", datapath.DefaultLayoutRecord, "the daemon's record of the pins' layout")
	fs.StringVar(&f.cniDataDir, "cni-data-dir", cnitap.DefaultDataDir, "the plugin's records")
	fs.StringVar(&f.vrfLockDir, "vrf-lock-dir", vrf.DefaultDir, "the VRF locks")
	fs.StringVar(&f.brakeMemory, "brake-memory", brakefile.DefaultPath, "the brake's memory")
	fs.StringVar(&f.proc, "proc", "/proc", "the node's /proc, where a pod sandbox is looked for by the processes in its cgroup")
	fs.StringVar(&f.logFormat, "log-format", "text", "json or text")
	fs.StringVar(&f.logLevel, "log-level", "warn", "debug, info, warn or error")
	return fs
}

// runUninstall cleans the node of what galactic left once the cluster no
// longer runs it (node/uninstall says what goes and what stays). Exit
// codes: 2 for a folder to remove that is not galactic's, 3 when a daemon
// still runs or the paths are not this node's (nothing changed), 4 when
// taps in use were kept, and with them what serves them.
func runUninstall(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	var f uninstallFlags
	fs := uninstallFlagSet(&f)
	if err := cli.Parse(fs, uninstallSynopsis, args, environ, knownEnv(), stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Misuse(fs.Name(), fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if f.output != "" && f.output != "json" {
		return cli.Misuse(fs.Name(), fmt.Errorf("-o %q: want json", f.output))
	}
	if !filepath.IsAbs(f.hostRoot) {
		return cli.Misuse(fs.Name(), fmt.Errorf("--host-root %q: want an absolute path", f.hostRoot))
	}
	log, err := logging.New(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return cli.Misuse(fs.Name(), err)
	}
	at := func(p string) string {
		if p == "" {
			return ""
		}
		return filepath.Join(f.hostRoot, p)
	}
	paths := uninstall.Paths{
		Root:        f.hostRoot,
		AdminSocket: at(f.adminSocket), CNIBinDir: at(f.cniBinDir), CLIDir: at(f.cliDir),
		SeccompDir: at(f.seccompDir), MultusConfDir: at(f.multusConfDir),
		LayoutRecord: at(f.layoutRecord), CNIDataDir: at(f.cniDataDir),
		VRFLockDir: at(f.vrfLockDir), BrakeMemory: at(f.brakeMemory),
	}
	if f.bpffs != "" {
		paths.PinDir = filepath.Join(at(f.bpffs), datapath.PinSubdir)
	}

	conn, err := link.Dial(nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	rows, closeRows := tapRows(at(f.bpffs), paths.PinDir, log)
	defer closeRows()
	rep, err := uninstall.Run(ctx, uninstall.Config{
		Paths:     paths,
		Links:     conn,
		Remover:   &teardown.Remover{Links: conn, Registry: rows, Locks: &lazyLocker{dir: paths.VRFLockDir, dryRun: f.dryRun}, Prober: holder.Prober{Links: conn}, Log: log},
		Processes: uninstall.ProcScanner{Proc: at(f.proc)},
		DryRun:    f.dryRun,
		Log:       log,
	})
	if f.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(rep); jerr != nil {
			return errors.Join(err, jerr)
		}
	} else {
		printUninstall(stdout, rep, err == nil)
	}
	switch {
	case errors.Is(err, uninstall.ErrUnsafePath):
		return cli.Misuse(fs.Name(), err)
	case errors.Is(err, uninstall.ErrDaemonRunning), errors.Is(err, uninstall.ErrNotThisNode):
		return &cli.ExitError{Code: 3, Err: err}
	case errors.Is(err, uninstall.ErrKept):
		return &cli.ExitError{Code: 4, Err: err}
	}
	return err
}

// tapRows is what clears a removed tap's eBPF rows: the pinned maps, when
// there are any; with none there are no rows, and maps this build cannot
// open go whole with the pin folder, once no tap is left to need them.
func tapRows(bpffs, pinDir string, log interface{ Warn(string, ...any) }) (teardown.Registry, func()) {
	if _, err := os.Stat(pinDir); err != nil {
		return noRows{}, func() {}
	}
	dp, err := datapath.OpenPinned(bpffs)
	if err != nil {
		log.Warn("the pinned maps cannot be opened: removed taps' rows go with the pin folder", "error", err)
		return noRows{}, func() {}
	}
	return attachreg.New(dp, nil, nil), func() { dp.Close() }
}

// lazyLocker makes the VRF lock folder only when a tap is to be removed:
// on a node galactic already left, the uninstall creates nothing. A dry
// run takes the locks only where the folder is already there: with none,
// no plugin holds a lock.
type lazyLocker struct {
	dir    string
	dryRun bool
	locks  *vrf.Locker
}

func (l *lazyLocker) Lock(ctx context.Context, vpc identity.VPC) (func(), error) {
	if l.locks == nil {
		if _, err := os.Stat(l.dir); err != nil && l.dryRun {
			return func() {}, nil
		}
		locks, err := vrf.NewLocker(l.dir)
		if err != nil {
			return nil, err
		}
		l.locks = locks
	}
	return l.locks.Lock(ctx, vpc)
}

// noRows clears nothing: there are no maps, or they go whole.
type noRows struct{}

func (noRows) UnregisterInterface(context.Context, uint32) error { return nil }

func printUninstall(w io.Writer, rep uninstall.Report, done bool) {
	verb := "removed"
	if rep.DryRun {
		verb = "would remove"
	}
	for _, t := range rep.TapsRemoved {
		fmt.Fprintf(w, "%s tap %s (ifindex %d, owner %s)\n", verb, t.Name, t.Ifindex, t.Owner)
	}
	for _, k := range rep.TapsKept {
		fmt.Fprintf(w, "kept tap %s (ifindex %d, owner %s): %s\n", k.Tap.Name, k.Tap.Ifindex, k.Tap.Owner, k.Why)
	}
	for _, f := range rep.TapsFailed {
		fmt.Fprintf(w, "kept tap %s (ifindex %d): %s failed: %s\n", f.Tap.Name, f.Tap.Ifindex, f.Stage, f.Error)
	}
	for _, p := range rep.Removed {
		fmt.Fprintf(w, "%s %s\n", verb, p)
	}
	if done && rep.Empty() {
		fmt.Fprintln(w, "nothing of galactic's is left on this node")
	}
}
