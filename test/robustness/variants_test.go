package robustness

import (
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/test/framework/chaostest"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

// TestTheCheckerCatchesEachBrokenDaemon runs the daemon built with test
// hooks (cmd/galactic-node/testhooks.go, never in a product binary) with
// one safety rule broken at a time, and fails unless the history shows
// that rule's violation within the variant's budget. Each variant leans
// the random work toward what its rule guards, as a fault-injection
// campaign aims; the checker is the same.
// variantBudget bounds each variant's random phase, whatever the main
// run's budget: a variant ends at its first violation, most within 20 s
// even on a loaded machine.
const variantBudget = 60 * time.Second

func TestTheCheckerCatchesEachBrokenDaemon(t *testing.T) {
	cluster := clustertest.Shared(t)
	for i, v := range []struct {
		broken string // GALACTICTEST_BREAK
		rule   string // the violation that must show
		lean   weights
		faults bool
	}{
		// Every tap looks unheld: a held tap whose identity went is taken.
		{"held", RuleHeld, weights{"create": 20, "add": 25, "hold": 25, "unhold": 0, "delete": 10, "mass-delete": 0,
			"pass": 30, "idle": 10, "release": 10, "del": 0, "gc": 0, "killed-add": 0, "cli-add": 0, "cli-del": 0}, false},
		// The inventory carries nothing: a live tap is taken.
		{"carried", RuleCarried, weights{"delete": 1, "mass-delete": 0, "hold": 0, "release": 15, "idle": 12}, false},
		// No minimum age: a tap goes on its second sighting.
		{"age", RuleAge, weights{"hold": 0, "delete": 12, "idle": 0, "pass": 40}, false},
		// The brake kept in the daemon only: a SIGKILL forgets it.
		{"brake-memory", RuleRestart, weights{"mass-delete": 3, "delete": 0, "add": 40, "create": 30, "hold": 0, "release": 0, "kill": 0, "kill-braked": 20, "idle": 5, "pass": 10,
			"del": 0, "gc": 0, "killed-add": 0, "cli-add": 0, "cli-del": 0, "kill-mid-pass": 0, "partition": 0, "slow": 0}, true},
	} {
		t.Run(v.broken, func(t *testing.T) {
			seed := chaostest.Seed()
			s := newScene(t, cluster, 10+i, bins.hooked, []string{"GALACTICTEST_BREAK=" + v.broken})
			// A quarter of the node's taps, at least 2: the brake engages
			// at almost every mass delete, however few taps a loaded
			// machine made before it.
			s.extra = []string{"--mass-removal-share", "0.25", "--mass-removal-min", "2"}
			r := newRun(t, s, seed, workload.with(v.lean))
			var found *Violation
			r.drive(variantBudget, v.faults, func(vs []Violation) bool {
				for _, x := range vs {
					if x.Rule == v.rule {
						found = &x
						return true
					}
				}
				return false
			})
			vs := r.finish()
			if found == nil {
				for _, x := range vs {
					if x.Rule == v.rule {
						found = &x
						break
					}
				}
			}
			if found == nil {
				t.Fatalf("the checker missed the daemon with %q broken (seed %d; history in %s): violations %v", v.broken, seed, r.keep(), vs)
			}
			t.Logf("caught: %s (seed %d)", found, seed)
		})
	}
}
