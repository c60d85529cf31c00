package robustness

import (
	"fmt"
	"io"
	"time"

	"github.com/datum-cloud/galactic-node/test/framework/jsonlines"
)

// Kind names what an Event records.
type Kind string

// The harness's operations, the faults it injects, and what it observed.
// An operation that may remove taps is recorded as a window (…Start at its
// beginning, …End once it returned), so that the checker can tell a removal
// the harness made from one the daemon made.
const (
	AttachmentCreated Kind = "attachment-created" // after the API server stored it
	AttachmentDeleted Kind = "attachment-deleted" // before the delete is sent
	TapMakeStart      Kind = "tap-make-start"     // an ADD or `tap add` begins: the tap is no older
	RemoveStart       Kind = "remove-start"       // a DEL, GC or `tap del` begins (Tap empty: any tap)
	RemoveEnd         Kind = "remove-end"
	HoldOpened        Kind = "hold-opened" // a VMM holds the tap
	HoldClosed        Kind = "hold-closed" // before its queues are closed
	ReleaseStart      Kind = "brake-release-start"
	ReleaseEnd        Kind = "brake-release-end"
	PassStart         Kind = "pass-start" // a forced pass (or a release's) is asked for
	PassEnd           Kind = "pass-end"   // and answered, or failed
	DaemonStarted     Kind = "daemon-started"
	DaemonKilled      Kind = "daemon-killed"
	FaultStart        Kind = "fault-start"
	FaultEnd          Kind = "fault-end"
	Quiet             Kind = "quiet" // no fault after this; the liveness bound starts
	Op                Kind = "op"    // any other operation, for the reader

	LinksSeen    Kind = "links"    // the node's tenant taps, when they changed
	Reported     Kind = "reported" // a removal a pass report lists, first seen
	PassesSeen   Kind = "passes"   // the removals /v1/passes listed at one read
	BrakeSeen    Kind = "brake"    // /v1/status's brake, when it changed
	RestartBrake Kind = "restart-brake"
	Residue      Kind = "residue" // what the node holds once settled that no live tap explains
	Settled      Kind = "settled"
)

// Event is one line of a history.
type Event struct {
	At      time.Time `json:"at"`
	Kind    Kind      `json:"kind"`
	Tap     string    `json:"tap,omitempty"`
	Ifindex uint32    `json:"ifindex,omitempty"`
	// Taps is a LinksSeen's whole view, name to ifindex; Since is when
	// the view before it was read, which still held what this one lacks.
	Taps  map[string]uint32 `json:"taps,omitempty"`
	Since time.Time         `json:"since,omitzero"`
	// Refs are a PassesSeen's removals, "name/ifindex".
	Refs   []string `json:"refs,omitempty"`
	Pass   string   `json:"pass,omitempty"` // a Reported's pass, by its start
	Brake  *Brake   `json:"brake,omitempty"`
	After  *Brake   `json:"after,omitempty"` // a RestartBrake's, Brake being before
	Detail string   `json:"detail,omitempty"`
}

// Brake is the mass-removal brake as /v1/status shows it.
type Brake struct {
	Engaged     bool      `json:"engaged"`
	Since       time.Time `json:"since,omitzero"`
	Reason      string    `json:"reason,omitempty"`
	Held        int       `json:"held"`
	LastRelease string    `json:"lastRelease,omitempty"`
}

// Same reports whether b and o are one brake state, as an operator reads it.
func (b Brake) Same(o Brake) bool {
	return b.Engaged == o.Engaged && b.Since.Equal(o.Since) && b.Reason == o.Reason && b.Held == o.Held && b.LastRelease == o.LastRelease
}

func ref(name string, ifindex uint32) string { return fmt.Sprintf("%s/%d", name, ifindex) }

// History is the run's record, kept as JSON lines (a failed run leaves the
// file behind).
type History = jsonlines.Log[Event]

// NewHistory writes the history to path.
func NewHistory(path string) (*History, error) {
	return jsonlines.Create(path, func(e *Event, now time.Time) {
		if e.At.IsZero() {
			e.At = now
		}
	})
}

// ReadHistory reads a history file back, to check it again.
func ReadHistory(r io.Reader) ([]Event, error) { return jsonlines.Read[Event](r) }
