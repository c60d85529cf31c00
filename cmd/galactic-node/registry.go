//go:build !galactic_testhooks

package main

import (
	"log/slog"

	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// reclaimInputs are what the reclaim is built from: the node's own links,
// inventory and registry. (A build with the galactic_testhooks tag may wrap
// them, or break a rule on purpose; see testhooks.go. Product builds never
// have that tag.)
func reclaimInputs(links reclaim.Links, inv inventory.Source, reg *attachreg.Registry, _ *reclaim.Config, _ *slog.Logger) (reclaim.Links, inventory.Source, reclaim.Registry) {
	return links, inv, reg
}

// breakFlags is where a test-hooks build breaks a flag's rule; here it
// does nothing.
func breakFlags(*daemonFlags, *slog.Logger) {}
