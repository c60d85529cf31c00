package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/datum-cloud/galactic-node/internal/envflag"
	"github.com/datum-cloud/galactic-node/node/cniinstall"
)

// runInstallCNI installs the CNI plugin and conflist into the host's CNI
// folders, and the daemon's seccomp profile into the kubelet's. The DaemonSet's init container runs it: the image has no shell
// to run cp and mv with. The defaults are the DaemonSet's mounts.
func runInstallCNI(ctx context.Context, args []string, stderr io.Writer) error {
	var c cniinstall.Config
	var logFormat, logLevel string
	fs := flag.NewFlagSet("galactic-node install-cni", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Plugin, "plugin", "/usr/local/bin/galactic-tap", "the CNI plugin binary to install")
	fs.StringVar(&c.Conflist, "conflist", "/etc/galactic/cni/10-galactic.conflist", "the network's conflist to install")
	fs.StringVar(&c.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the host's CNI plugin folder (made 0755 if missing)")
	fs.StringVar(&c.ConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "the host's CNI configuration folder (made 0755 if missing)")
	fs.StringVar(&c.Seccomp, "seccomp-profile", "/etc/galactic/seccomp/galactic-node.json", "the daemon's seccomp profile to install (empty: none)")
	fs.StringVar(&c.SeccompDir, "seccomp-dir", "/host/var/lib/kubelet/seccomp/galactic", "where the kubelet reads Localhost seccomp profiles (empty: none)")
	fs.StringVar(&logFormat, "log-format", "json", "json or text")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := envflag.Set(fs, os.LookupEnv); err != nil {
		return err
	}
	log, err := newLogger(stderr, logFormat, logLevel)
	if err != nil {
		return err
	}
	_, err = cniinstall.Install(ctx, c, log)
	return err
}
