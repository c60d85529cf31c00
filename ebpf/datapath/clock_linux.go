package datapath

import (
	"time"

	"golang.org/x/sys/unix"
)

// monotonicCoarse is CLOCK_MONOTONIC_COARSE, the clock of the program's
// bpf_ktime_get_coarse_ns.
func monotonicCoarse() time.Duration {
	var ts unix.Timespec
	// Cannot fail: the clock exists on every kernel this program loads on.
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return time.Duration(ts.Nano())
}
