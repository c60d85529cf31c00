//go:build !linux

package datapath

import "time"

// monotonicCoarse has no program to agree with off Linux, where no view is
// ever published.
func monotonicCoarse() time.Duration { return 0 }
