package main

import (
	"context"
	"flag"
	"io"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/internal/cli"
	"github.com/datum-cloud/galactic-node/internal/logging"
	"github.com/datum-cloud/galactic-node/node/cniinstall"
)

type installCNIFlags struct {
	cniinstall.Config
	logFormat, logLevel string
}

// installCNIFlagSet defines the flags of galactic-node install-cni into c.
// The defaults are the DaemonSet's mounts, and install the plugin alone:
// the network's configuration belongs in a NetworkAttachmentDefinition,
// where Multus and KubeVirt read secondary networks.
func installCNIFlagSet(c *installCNIFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("galactic-node install-cni", flag.ContinueOnError)
	fs.StringVar(&c.Plugin, "plugin", "/usr/local/bin/galactic-tap", "the CNI plugin binary to install")
	fs.StringVar(&c.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the host's CNI plugin folder (made 0755 if missing)")
	fs.StringVar(&c.Conflist, "conflist", "/etc/galactic/cni/10-galactic.conflist",
		"the network's conflist: installed only where -multus-conf-dir or -conflist-into-default-network-dir ask, and the name of the file an older install left in -cni-conf-dir (empty: none)")
	fs.StringVar(&c.MultusConfDir, "multus-conf-dir", "",
		"Multus' own configuration folder (its confDir, on the host /etc/cni/multus/net.d), to install the conflist into for a NetworkAttachmentDefinition with no spec.config (empty: none)")
	fs.StringVar(&c.ConfDir, "cni-conf-dir", "/host/etc/cni/net.d",
		"the container runtime's CNI configuration folder, whose first file by name is every pod's network: nothing is written there unless -conflist-into-default-network-dir, and a galactic conflist an older install left there is removed")
	fs.BoolVar(&c.IntoConfDir, "conflist-into-default-network-dir", false,
		"also install the conflist into -cni-conf-dir, where it becomes the network of every pod on the node if its name sorts first; only for nodes whose every pod carries a galactic attachment identity (logged as a warning)")
	fs.StringVar(&c.Seccomp, "seccomp-profile", "/etc/galactic/seccomp/galactic-node.json", "the daemon's seccomp profile to install (empty: none)")
	fs.StringVar(&c.SeccompDir, "seccomp-dir", "/host/var/lib/kubelet/seccomp/galactic", "where the kubelet reads Localhost seccomp profiles (empty: none)")
	fs.StringVar(&c.CLI, "cli", "/usr/local/bin/galactic-node", "the operator CLI (this binary) to install on the host (empty: none)")
	fs.StringVar(&c.CLIDir, "cli-dir", "/host/opt/galactic/bin", "where on the host the CLI goes, for the runbooks' commands on the node (empty: none)")
	fs.StringVar(&c.PinDir, "pin-dir", "/host/sys/fs/bpf/"+datapath.PinSubdir,
		"the host's pinned datapath maps, mounted read-only: with maps pinned there whose recorded layout differs from this build's, nothing is installed (empty: no check)")
	fs.StringVar(&c.LayoutRecord, "layout-record", "/host"+datapath.DefaultLayoutRecord, "where the daemon recorded the pinned maps' layout (its --layout-record)")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or text")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	return fs
}

// runInstallCNI installs the CNI plugin into the host's plugin folder, the
// network's conflist where asked, and the daemon's seccomp profile into the
// kubelet's folder. The DaemonSet's init container runs it: the image has
// no shell to run cp and mv with.
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
	if c.PinDir != "" {
		pins, err := datapath.ThisBuildsPins()
		if err != nil {
			return err
		}
		c.Layout, c.Shape, c.PinnedMaps = pins.Layout, pins.Shape, pins.Maps
	}
	if err := c.Check(); err != nil {
		return cli.Misuse(fs.Name(), err)
	}
	_, err = cniinstall.Install(ctx, c.Config, log)
	return err
}
