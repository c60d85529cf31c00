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
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch args[0] {
	case "run":
		err = runDaemon(ctx, args[1:], stderr)
	case "tap":
		err = runTap(ctx, args[1:], stdout, stderr)
	case "install-cni":
		err = runInstallCNI(ctx, args[1:], stderr)
	case "version":
		fmt.Fprintln(stdout, version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "unknown command %q\n%s\n", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "galactic-node: "+err.Error())
		return 1
	}
	return 0
}

const usage = `usage: galactic-node <command> [flags]

commands:
  run          run the node daemon (galactic-node run -h for its flags)
  install-cni  install the CNI plugin and conflist into the host's CNI folders, atomically
               (galactic-node install-cni -h for its flags)
  tap          add or delete a tenant tap as CNI ADD/DEL would, for labs and the demo
  version      print the version`

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}
