//go:build !galactic_testhooks

package main

import (
	"log/slog"

	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// reclaimRegistry is the registry the reclaim clears rows through: the
// node's own. (A build with the galactic_testhooks tag may wrap it; see
// testhooks.go. Product builds never have that tag.)
func reclaimRegistry(reg *attachreg.Registry, _ *slog.Logger) reclaim.Registry { return reg }
