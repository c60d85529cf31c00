// Command galactic-tap is the CNI plugin that creates, checks and removes
// tenant taps, and garbage-collects those of attachments the runtime no
// longer lists (CNI 1.1 GC). See package node/cnitap.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/datum-cloud/galactic-node/internal/buildinfo"
	"github.com/datum-cloud/galactic-node/internal/cli"
	"github.com/datum-cloud/galactic-node/internal/logging"
	"github.com/datum-cloud/galactic-node/node/cnitap"
)

// buildVersion is set at build time with -ldflags "-X main.buildVersion=...".
var buildVersion = "dev"

const prog = "galactic-tap"

// The plugin has no flags and reads no GALACTIC_* variable: it runs with
// whatever environment the container runtime gives it, which is not ours
// to police, and a CNI ADD or DEL failing over an unrelated variable would
// strand a workload's network. (CNI_ARGS keys named GALACTIC_* are the
// plugin's arguments, not environment variables; see node/cnitap.)
func main() {
	// Runtimes set CNI_COMMAND and pass no arguments: arguments without it
	// are a person at a shell. CNI_COMMAND=VERSION and the "about" text
	// skel prints when CNI_COMMAND is unset stay skel's.
	if os.Getenv("CNI_COMMAND") == "" && len(os.Args) > 1 {
		os.Exit(shell(os.Args[1:], os.Stdout, os.Stderr))
	}
	// stdout carries the CNI result; logs go to stderr, which runtimes keep.
	log, err := logging.New(os.Stderr, "json", "info")
	if err != nil {
		panic(err) // constant arguments: a programming error
	}
	p := &cnitap.Plugin{Log: log.With("plugin", prog)}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status},
		version.PluginSupports("1.0.0", "1.1.0"), prog+" "+buildinfo.Version(buildVersion))
}

// shell answers version and help as the other binaries do, and returns
// the exit code.
func shell(args []string, stdout, stderr io.Writer) int {
	var err error
	switch args[0] {
	case "version", "--version", "-version":
		if len(args) > 1 {
			err = cli.Misuse(prog, fmt.Errorf("%s takes no arguments", args[0]))
			break
		}
		fmt.Fprintln(stdout, buildinfo.Version(buildVersion))
	case "help", "-h", "--help", "-help":
		_, _ = fmt.Fprint(stdout, usage)
	default:
		err = cli.Misuse(prog, fmt.Errorf("unknown argument %q", args[0]))
	}
	return cli.Exit(stderr, prog, err)
}

const usage = `usage: galactic-tap            (run by a container runtime: CNI_COMMAND and CNI_* in the environment, the network configuration on stdin)
       galactic-tap version    (also --version)

galactic-tap is a CNI plugin (CNI 1.0.0 and 1.1.0: ADD, DEL, CHECK, GC, STATUS, VERSION).
It takes no flags and ignores GALACTIC_* variables: its environment is the runtime's.
`
