package reclaim

import (
	"github.com/datum-cloud/galactic-node/node/teardown"
)

// Stage is where a removal failed (teardown's).
type Stage = teardown.Stage

// Failure stages, the values of a Failure's Stage.
const (
	StageLock   = teardown.StageLock
	StageVerify = teardown.StageVerify
	StageProbe  = teardown.StageProbe
	StageRows   = teardown.StageRows
	StageLink   = teardown.StageLink
)

// Result is how a pass ended. It marshals as its string, which operators
// and the passes metric's result label read.
type Result string

// Pass results, the values of a Report's Result.
const (
	ResultCompleted Result = "completed" // the pass ran to the end, removals or not
	ResultSkipped   Result = "skipped"   // inputs were not trustworthy: nothing removed
	ResultFailed    Result = "failed"    // the links could not be read
	// ResultRunning is the pass in flight, as views list it; no
	// finished pass has it.
	ResultRunning Result = "running"
)

// Maps of cleared orphan state that are not eBPF row maps, as
// Observer.OrphanRowsCleared names them.
const (
	MapTCXLink   = "tcx_link"  // a TCX link pin
	MapDecisions = "decisions" // decision counters of identities no interface names
)

// MalformedCount is how many objects of each kind the inventory could not
// read: their identity fields are set but do not parse.
type MalformedCount struct {
	Attachments    int // VPCAttachments
	Advertisements int // BGPAdvertisements
}

// Observer is told what the reclaim does, for metrics (reclaimmetrics
// exports it to Prometheus). It is an interface so that the reclaim links
// no metrics library. Its methods are called from the pass, so they must
// not block.
type Observer interface {
	// Malformed is called, every pass, with how many objects of each kind
	// in the pass's snapshot could not be read, zeros included. Counts, not
	// the objects: their names are the tenants' to choose and as many as
	// they make, so a metric labelled by them would grow without bound on
	// every node (the pass's report names a few, MalformedSample).
	Malformed(c MalformedCount)
	// PassDone is called with the report of every pass, and the candidates
	// pending after it.
	PassDone(rep Report, pending int)
	// OrphanRowsCleared is called with n rows cleared from eBPF map m (or
	// MapTCXLink, MapDecisions) by the orphan collection.
	OrphanRowsCleared(m string, n int)
}
