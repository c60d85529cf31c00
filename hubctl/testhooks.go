//go:build galactic_testhooks

// This file is compiled only with -tags galactic_testhooks, which only the
// robustness harness uses (test/robustness/hub builds galactic-hubctl with
// the tag beside the product build); integration/attack_test.go proves the
// product binaries carry nothing of it.
//
// It holds the broken variants the harness must catch, or show harmless,
// selected by GALACTICTEST_HUB_BREAK, which nothing else reads. No product
// file calls into it: the harness's build splices the calls in with
// `go build -overlay` (test/robustness/hub, hookSites), so the product's
// source carries no switch, and a build with the calls but without the tag
// does not compile.

package hubctl

import (
	"context"
	"fmt"
	"log/slog"
	"os"
)

// testhookBreakEnv names the variant to break ("" breaks nothing):
//
//   - direct-read-off: every read past the cache finds every network gone
//     (the chaos suite's BreakDirectRead), so a collect, and the startup
//     sweep, take a live network's identity and claim;
//   - no-gather: a read that confirms networks gone starts at once rather
//     than waiting for the collects in progress to ask (confirm.go);
//   - no-deleting-check: a release deletes again a claim whose delete was
//     accepted and waits on finalizers (releaseClaim);
//   - lost-wakeup: a claim's going wakes no network that waits for a unit
//     or for its own claim to go (ClaimGone).
const testhookBreakEnv = "GALACTICTEST_HUB_BREAK"

var testhookBreak = os.Getenv(testhookBreakEnv)

// testhookBroken reports whether variant is the one broken.
func testhookBroken(variant string) bool { return testhookBreak == variant }

// testhookAPI is api, or api broken as GALACTICTEST_HUB_BREAK asks; it
// says so in the log, once per controller.
func testhookAPI(api API, log *slog.Logger) API {
	if testhookBreak != "" {
		log.Warn("TEST HOOK ACTIVE: a broken variant of the hub", "env", testhookBreakEnv, "variant", testhookBreak)
	}
	if testhookBroken("direct-read-off") {
		return testhookGoneNetworks{api}
	}
	return api
}

// testhookGoneNetworks reads every network as gone past the cache.
type testhookGoneNetworks struct{ API }

func (testhookGoneNetworks) GetNetwork(_ context.Context, namespace, name string) (Network, error) {
	return Network{}, fmt.Errorf("network %s/%s: %w", namespace, name, ErrNotFound)
}

func (testhookGoneNetworks) ListNetworkKeys(context.Context) ([]Key, error) { return nil, nil }
