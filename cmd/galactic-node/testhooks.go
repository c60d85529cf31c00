//go:build galactic_testhooks

// This file is compiled only with -tags galactic_testhooks, which only the
// tests use (integration/daemon_test.go and test/robustness build such a
// daemon beside the product one); integration/attack_test.go proves the
// product binaries carry nothing of it.

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/reclaim/reclaimbreak"
)

// hangAfterLinksEnv names a marker file. When it is set, the first removal
// that has deleted its links and comes to clear their rows writes the
// marker and hangs, so that the restart test can SIGKILL the daemon between
// a tap's link and its rows.
const hangAfterLinksEnv = "GALACTICTEST_HANG_AFTER_LINKS"

// breakEnv names one safety rule to break, so that test/robustness can
// prove its checker catches a daemon without it:
//
//	held          every tap looks unheld and the kernel probe says free
//	carried       the inventory carries no identity (health and counts kept)
//	age           --min-candidate-age is ignored (0)
//	brake-memory  the brake is kept in the daemon only, forgotten on restart
//	              (--brake-memory=, as before the brake had a memory)
const breakEnv = "GALACTICTEST_BREAK"

func breakFlags(f *daemonFlags, log *slog.Logger) {
	switch rule := os.Getenv(breakEnv); rule {
	case "age":
		f.minCandidateAge = 0
	case "brake-memory":
		f.brakeMemory = ""
	default:
		return
	}
	log.Warn("TEST HOOK ACTIVE: a safety rule is broken", "env", breakEnv, "rule", os.Getenv(breakEnv))
}

func reclaimInputs(links reclaim.Links, inv inventory.Source, reg *attachreg.Registry, cfg *reclaim.Config, log *slog.Logger) (reclaim.Links, inventory.Source, reclaim.Registry) {
	var r reclaim.Registry = reg
	if marker := os.Getenv(hangAfterLinksEnv); marker != "" {
		log.Warn("TEST HOOK ACTIVE: removals hang after deleting links", "env", hangAfterLinksEnv)
		r = hangAfterLinks{Registry: reg, marker: marker}
	}
	switch rule := os.Getenv(breakEnv); rule {
	case "held":
		links = reclaimbreak.UnheldLinks{Inner: links}
		cfg.Prober = reclaimbreak.BlindProber{}
	case "carried":
		asker, ok := inv.(inventory.Asker)
		if !ok {
			panic(fmt.Sprintf("%s=carried needs --inventory=candidates, not %T", breakEnv, inv))
		}
		inv = reclaimbreak.UncarriedAsker{Asker: asker}
	case "", "age", "brake-memory":
		return links, inv, r
	default:
		panic(fmt.Sprintf("%s=%q: no such rule to break", breakEnv, rule))
	}
	log.Warn("TEST HOOK ACTIVE: a safety rule is broken", "env", breakEnv, "rule", os.Getenv(breakEnv))
	return links, inv, r
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
