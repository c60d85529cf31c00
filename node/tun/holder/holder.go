// Package holder tells whether any file descriptor holds a tenant tap open.
//
// The rule a caller must know: a tap counts as held unless something proves
// it free. For a multiqueue tap the kernel's queue counts prove it. A
// single-queue tap reports no counts, and its carrier is no proof either: any
// CAP_NET_ADMIN process can set it off while a VMM holds the tap. Only a scan
// of every process's descriptors proves a single-queue tap free, and a scan
// sees every process only from the initial PID namespace; anywhere else a
// single-queue tap stays held.
package holder

import (
	"context"
	"fmt"

	"github.com/datum-cloud/galactic-node/node/link"
)

// Holder is a process holding a tap's queue open.
type Holder struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
}

// Scan is one reading of the tun descriptors of every visible process. The
// zero Scan is incomplete: it proves nothing.
type Scan struct {
	byTap    map[string][]Holder
	complete bool
	// why the scan cannot prove a tap free, when it is not complete
	why string
}

// NewScan returns a Scan of holders found by a Scanner other than Proc;
// incomplete says why it cannot prove a tap free, empty when it saw every
// process.
func NewScan(holders map[string][]Holder, incomplete string) Scan {
	return Scan{byTap: holders, complete: incomplete == "", why: incomplete}
}

// Holders returns the processes the scan found holding the tap called name.
// Tap names are per network namespace and fdinfo names only the device, so
// a holder of a same-named tap in another namespace is reported too: the
// side that keeps taps.
func (s Scan) Holders(name string) []Holder { return s.byTap[name] }

// Complete reports whether the scan saw every process of the host, and if
// not, why.
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

// Judge decides whether taps are held. It scans processes at most once, and
// only when a single-queue tap needs it: one Judge serves one decision point,
// so that every recheck reads the processes afresh.
type Judge struct {
	scanner Scanner
	scan    *Scan
}

// NewJudge returns a Judge over scanner; a nil scanner never proves a
// single-queue tap free.
func NewJudge(scanner Scanner) *Judge { return &Judge{scanner: scanner} }

// Held reports whether t may be held, and why. Whenever the kernel's answer
// is missing or did not decode, the tap is held.
func (j *Judge) Held(ctx context.Context, t link.Tap) (bool, string) {
	tun := t.Tun
	switch {
	case tun == nil || tun.Err() != nil:
		return true, "tun attributes missing or undecodable: presumed held"
	case tun.MultiQueue:
		attached, disabled, ok := tun.QueueCounts()
		switch {
		case !ok:
			return true, "queue counts missing: presumed held"
		case attached+disabled > 0:
			return true, fmt.Sprintf("%d queues attached, %d disabled", attached, disabled)
		case t.Carrier == nil || *t.Carrier:
			return true, "carrier on or unknown"
		}
		return false, ""
	}
	if t.Carrier == nil || *t.Carrier {
		return true, "single-queue tap with carrier on or unknown"
	}
	if j.scanner == nil {
		return true, "single-queue tap and no holder scan: only a scan of every process proves it free"
	}
	if j.scan == nil {
		s := j.scanner.Scan(ctx)
		j.scan = &s
	}
	if ok, why := j.scan.Complete(); !ok {
		return true, "single-queue tap and the holder scan is incomplete: " + why
	}
	if hs := j.scan.Holders(t.Name); len(hs) > 0 {
		return true, fmt.Sprintf("single-queue tap held by pid %d", hs[0].PID)
	}
	return false, ""
}

// Holders returns the processes holding the tap called name, scanning once
// per Judge; nil when no scanner is configured.
func (j *Judge) Holders(ctx context.Context, name string) []Holder {
	if j.scanner == nil {
		return nil
	}
	if j.scan == nil {
		s := j.scanner.Scan(ctx)
		j.scan = &s
	}
	return j.scan.Holders(name)
}
