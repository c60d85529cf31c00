// Package holder tells whether any file holds a tenant tap open, and which
// processes do.
//
// The kernel is the only judge. Held reads the tun attributes of a link
// dump: a multiqueue tap's queue counts count every attached file, wherever
// it is; a single-queue tap reports none, and its carrier can be forced off
// while a VMM holds it, so carrier off only makes it a candidate. Before a
// tap is removed, Prober attaches to it: the kernel refuses a second file on
// a single-queue tap (EBUSY), and the probe's claim then holds the tap's only
// queue until the delete, so no VMM can attach in between.
//
// A scan of /proc (Proc) names the processes that hold taps, for operators.
// It never decides a removal: a file in flight over SCM_RIGHTS or registered
// in an io_uring is in no process's table, and a scan without the host's PID
// namespace, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, or under a hidepid
// /proc, misses processes. It says when it is incomplete, and why.
package holder

import (
	"context"
	"fmt"

	"github.com/datum-cloud/galactic-node/node/link"
)

// Held reports whether the kernel's report of t, from a link dump, leaves it
// possibly held, and why. Whenever the kernel's answer is missing or did not
// decode, the tap is held. Administrative state never counts. A single-queue
// tap with carrier off reads not held here; only a Prober's attach proves it
// free, which the removal does before any delete.
func Held(t link.Tap) (bool, string) {
	tun := t.Tun
	switch {
	case tun == nil || tun.Err() != nil:
		return true, "tun attributes missing or undecodable: presumed held"
	case t.Carrier == nil:
		return true, "carrier unknown: presumed held"
	case tun.MultiQueue:
		attached, disabled, ok := tun.QueueCounts()
		switch {
		case !ok:
			return true, "queue counts missing: presumed held"
		case attached+disabled > 0:
			return true, fmt.Sprintf("%d queues attached, %d disabled", attached, disabled)
		}
	}
	if *t.Carrier {
		// The kernel turns carrier off when the last queue detaches and
		// refuses to turn it on with no queue (tun_net_change_carrier).
		return true, "carrier on: a file is attached"
	}
	return false, ""
}

// Holder is a process holding a tap's queue open.
type Holder struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
}

// Scan is one reading of the tun descriptors of every visible process. The
// zero Scan is incomplete.
type Scan struct {
	byTap    map[string][]Holder
	complete bool
	// why the scan may have missed holders, when it is not complete
	why string
}

// NewScan returns a Scan of holders found by a Scanner other than Proc;
// incomplete says why it may have missed holders, empty when it saw every
// process.
func NewScan(holders map[string][]Holder, incomplete string) Scan {
	return Scan{byTap: holders, complete: incomplete == "", why: incomplete}
}

// Holders returns the processes the scan found holding the tap called name.
// Tap names are per network namespace and fdinfo names only the device, so
// a holder of a same-named tap in another namespace is reported too.
func (s Scan) Holders(name string) []Holder { return s.byTap[name] }

// Complete reports whether the scan saw every process's descriptors, and if
// not, why. Even a complete scan misses files in no process's table.
func (s Scan) Complete() (bool, string) {
	if !s.complete && s.why == "" {
		return false, "no scan was made"
	}
	return s.complete, s.why
}

// Scanner scans processes for tap holders. Proc is the real one.
type Scanner interface {
	Scan(ctx context.Context) Scan
}
