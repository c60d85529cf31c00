// Package chaostest sizes and seeds the chaos suites: GALACTICTEST_CHAOS_SEED
// replays a run (every failure message carries its seed), and
// GALACTICTEST_CHAOS_OPS changes how many operations a suite runs.
package chaostest

import (
	"os"
	"strconv"
	"time"
)

// Seed is GALACTICTEST_CHAOS_SEED when set, else the clock.
func Seed() uint64 {
	if s, err := strconv.ParseUint(os.Getenv("GALACTICTEST_CHAOS_SEED"), 10, 64); err == nil {
		return s
	}
	return uint64(time.Now().UnixNano())
}

// Ops is GALACTICTEST_CHAOS_OPS when set, else def.
func Ops(def int) int {
	if n, err := strconv.Atoi(os.Getenv("GALACTICTEST_CHAOS_OPS")); err == nil && n > 0 {
		return n
	}
	return def
}
