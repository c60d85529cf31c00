package main

import (
	"context"
	"flag"
	"io"

	"github.com/datum-cloud/galactic-node/internal/cli"
	"github.com/datum-cloud/galactic-node/internal/logging"
	"github.com/datum-cloud/galactic-node/node/cniinstall"
)

type installCNIFlags struct {
	cniinstall.Config
	logFormat, logLevel string
}

// installCNIFlagSet defines the flags of galactic-node install-cni into c.
// The defaults are the DaemonSet's mounts.
func installCNIFlagSet(c *installCNIFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("galactic-node install-cni", flag.ContinueOnError)
	fs.StringVar(&c.Plugin, "plugin", "/usr/local/bin/galactic-tap", "the CNI plugin binary to install")
	fs.StringVar(&c.Conflist, "conflist", "/etc/galactic/cni/10-galactic.conflist", "the network's conflist to install")
	fs.StringVar(&c.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the host's CNI plugin folder (made 0755 if missing)")
	fs.StringVar(&c.ConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "the host's CNI configuration folder (made 0755 if missing)")
	fs.StringVar(&c.Seccomp, "seccomp-profile", "/etc/galactic/seccomp/galactic-node.json", "the daemon's seccomp profile to install (empty: none)")
	fs.StringVar(&c.SeccompDir, "seccomp-dir", "/host/var/lib/kubelet/seccomp/galactic", "where the kubelet reads Localhost seccomp profiles (empty: none)")
	fs.StringVar(&c.CLI, "cli", "/usr/local/bin/galactic-node", "the operator CLI (this binary) to install on the host (empty: none)")
	fs.StringVar(&c.CLIDir, "cli-dir", "/host/opt/galactic/bin", "where on the host the CLI goes, for the runbooks' commands on the node (empty: none)")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or text")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	return fs
}

// runInstallCNI installs the CNI plugin and conflist into the host's CNI
// folders, and the daemon's seccomp profile into the kubelet's. The
// DaemonSet's init container runs it: the image has no shell to run cp and
// mv with.
func runInstallCNI(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	var c installCNIFlags
	fs := installCNIFlagSet(&c)
	if err := cli.Parse(fs, "galactic-node install-cni [flags]", args, environ, knownEnv(), stdout); err != nil {
		return err
	}
	log, err := logging.New(stderr, c.logFormat, c.logLevel)
	if err != nil {
		return cli.Misuse(fs.Name(), err)
	}
	_, err = cniinstall.Install(ctx, c.Config, log)
	return err
}
