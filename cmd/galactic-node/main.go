// Command galactic-node is the node daemon: it reclaims tenant taps that
// outlived their VPCAttachment, and serves an authenticated admin API and
// Prometheus metrics. See README.md for every flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/datum-cloud/galactic-node/internal/buildinfo"
	"github.com/datum-cloud/galactic-node/internal/cli"
	"github.com/datum-cloud/galactic-node/internal/envflag"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const prog = "galactic-node"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command of args with the environment environ and returns
// the process's exit code (see internal/cli).
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return cli.Exit(stderr, prog, cli.Misuse(prog, errors.New("no command given")))
	}
	var err error
	switch args[0] {
	case "run":
		err = runDaemon(ctx, args[1:], environ, stdout, stderr)
	case "tap":
		err = runTap(ctx, args[1:], environ, stdout, stderr)
	case "install-cni":
		err = runInstallCNI(ctx, args[1:], environ, stdout, stderr)
	case "uninstall":
		err = runUninstall(ctx, args[1:], environ, stdout, stderr)
	case "version", "--version", "-version":
		if len(args) > 1 {
			err = cli.Misuse(prog, fmt.Errorf("%s takes no arguments", args[0]))
			break
		}
		fmt.Fprintln(stdout, buildinfo.Version(version))
	case "help", "-h", "--help", "-help":
		if len(args) > 1 && args[1] != "help" {
			// galactic-node help run: the command's own usage.
			return run(ctx, []string{args[1], "--help"}, environ, stdout, stderr)
		}
		fmt.Fprintln(stdout, usage)
	default:
		if _, ok := clientCommands[args[0]]; ok {
			return runClient(ctx, args[0], args[1:], stdout, stderr)
		}
		err = cli.Misuse(prog, fmt.Errorf("unknown command %q", args[0]))
	}
	return cli.Exit(stderr, prog, err)
}

// knownEnv is the GALACTIC_* variable of every flag of every command: one
// environment often serves several of them (the DaemonSet's init container
// runs install-cni, its main container run), so a variable meant for a
// sibling command is not a mistake.
func knownEnv() map[string]bool {
	var c installCNIFlags
	sets := []*flag.FlagSet{daemonFlagSet(&daemonFlags{}), installCNIFlagSet(&c), tapFlagSet("add", &tapFlags{}), uninstallFlagSet(&uninstallFlags{})}
	for cmd := range clientCommands {
		sets = append(sets, clientFlagSet(cmd, &clientOpts{}))
	}
	return envflag.Names(sets...)
}

const usage = `usage: galactic-node <command> [flags]

commands:
  run          run the node daemon
  install-cni  install the CNI plugin (and the network's conflist where asked) on the host, atomically
  tap          add or delete a tenant tap as CNI ADD/DEL would, for labs and the demo
  uninstall    clean the node once galactic is deleted from the cluster: unused taps, plugin, CLI, pins, records (--dry-run)
  status       the daemon's readiness, passes, brake, inventory and map fill
  taps [NAME]  the tenant taps and their state (--state, --vpc), or one tap
  pending      the candidates waiting for a confirming pass
  passes       recent pass reports, newest first
  pass         force a pass now (--dry-run, --allow-mass-removal)
  maps [NAME]  the eBPF maps, or one map's rows
  rows IFINDEX the eBPF rows of one interface
  drops        sampled records of dropped frames (--follow)
               (these talk to the running daemon over its admin socket)
  version      print the version (also --version)
  help         print this (also -h, --help); galactic-node <command> --help for a command's flags

Every flag can also be set as GALACTIC_<FLAG> (upper case, dashes as
underscores); a GALACTIC_* variable that is no command's flag is an error.`
