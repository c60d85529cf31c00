//go:build galactic_testhooks

// This file is compiled only with -tags galactic_testhooks, which only the
// integration tests use (integration/daemon_test.go builds such a daemon
// beside the product one); integration/attack_test.go proves the product
// binaries carry nothing of it.

package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// hangAfterLinksEnv names a marker file. When it is set, the first removal
// that has deleted its links and comes to clear their rows writes the
// marker and hangs, so that the restart test can SIGKILL the daemon between
// a tap's link and its rows.
const hangAfterLinksEnv = "GALACTICTEST_HANG_AFTER_LINKS"

func reclaimRegistry(reg *attachreg.Registry, log *slog.Logger) reclaim.Registry {
	marker := os.Getenv(hangAfterLinksEnv)
	if marker == "" {
		return reg
	}
	log.Warn("TEST HOOK ACTIVE: removals hang after deleting links", "env", hangAfterLinksEnv)
	return hangAfterLinks{Registry: reg, marker: marker}
}

// hangAfterLinks is the node's registry, except that clearing rows (which
// the teardown does only after the links are deleted) hangs first. It keeps
// every other method of the registry, the orphan lister included.
type hangAfterLinks struct {
	*attachreg.Registry
	marker string
}

func (h hangAfterLinks) UnregisterInterface(ctx context.Context, ifindex uint32) error {
	_ = os.WriteFile(h.marker, []byte("links deleted\n"), 0o600)
	time.Sleep(time.Hour)
	return h.Registry.UnregisterInterface(ctx, ifindex)
}
