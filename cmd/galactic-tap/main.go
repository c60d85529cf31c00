// Command galactic-tap is the CNI plugin that creates, checks and removes
// tenant taps, and garbage-collects those of attachments the runtime no
// longer lists (CNI 1.1 GC). See package node/cnitap.
package main

import (
	"log/slog"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/datum-cloud/galactic-node/node/cnitap"
)

var buildVersion = "dev"

func main() {
	// stdout carries the CNI result; logs go to stderr, which runtimes keep.
	p := &cnitap.Plugin{Log: slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("plugin", "galactic-tap")}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status},
		version.PluginSupports("1.0.0", "1.1.0"), "galactic-tap "+buildVersion)
}
