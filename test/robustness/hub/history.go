// Package hub is the hub half of the robustness harness (issue 54): two
// replicas of the built galactic-hubctl, electing a leader, against a real
// kube-apiserver and etcd, under random work (networks created, deleted and
// re-created under one name; claims kept under each reclaim policy; the
// quota at its limit) and random faults (the leader killed, or stopped past
// its lease), once against the CRD model of the address service and once
// against the ipam-shaped one (test/framework/ipamtest).
//
// Everything that happens is recorded as a History, one JSON object a line:
// each operation, each fault, each change the harness's own watches
// observe, with the resourceVersion etcd gave it, and, from the API
// server's audit log, each read of networks a replica made past its cache
// (the reads a collect rests on) and each network's create and delete. Check is a plain function
// of that history: the rules it holds the hub to are stated there, and its
// tests feed it histories written by hand.
package hub

import (
	"strconv"
	"time"

	"github.com/datum-cloud/galactic-node/test/framework/jsonlines"
)

// Kinds of event.
const (
	KindPhase    = "phase"    // the harness moved on: What is start, faults-stop, settled
	KindOp       = "op"       // the workload wrote: What is create or delete
	KindFault    = "fault"    // What is sigkill, sigstop, sigcont, exit, start
	KindObserve  = "observe"  // a watch saw Object change: What is added, modified or deleted
	KindSnapshot = "snapshot" // a consistent look at the end state
	KindNote     = "note"     // anything else worth reading
	// KindRead is a read of networks a replica made past its cache, from
	// the API server's audit log: What is get or list; T is when the API
	// server received it and Done when it answered.
	KindRead = "read"
	// KindStored is a network's create or delete (What), from the audit
	// log, with the API server's times as KindRead's: the clock the reads
	// are compared on.
	KindStored = "stored"
)

// Objects a watch observes.
const (
	ObjectNetwork  = "network"
	ObjectIdentity = "identity"
	ObjectClaim    = "claim"
)

// Event is one line of a history.
type Event struct {
	T    time.Time `json:"t"`
	Kind string    `json:"kind"`
	What string    `json:"what"`
	// Object is what an observe event saw.
	Object string `json:"object,omitempty"`
	// Network is "namespace/name": the network an op, an observed network
	// or identity, or an observed claim (by its annotations) is about.
	Network string `json:"network,omitempty"`
	UID     string `json:"uid,omitempty"`
	// RV is the resourceVersion etcd gave the change (for a deletion, the
	// deletion's own), so that observations of different watches can be
	// ordered: one API server, one etcd, whose revisions only grow.
	RV       uint64 `json:"rv,omitempty"`
	FabricID uint32 `json:"fabricID,omitempty"`
	Claim    string `json:"claim,omitempty"`
	Block    string `json:"block,omitempty"`
	Phase    string `json:"phase,omitempty"`
	Replica  string `json:"replica,omitempty"`
	Err      string `json:"err,omitempty"`
	Detail   string `json:"detail,omitempty"`
	// Gap: the watch lost track before this event (it listed anew), so
	// what happened in between is not in the history.
	Gap      bool      `json:"gap,omitempty"`
	Snapshot *Snapshot `json:"snapshot,omitempty"`
	// Done is when the API server answered a read or a write (KindRead,
	// KindStored); Code is its HTTP status. A read's Network is the
	// network a get named, or the scope of a list: "" for every
	// namespace, "namespace/" for one; a list's RV is the revision it was
	// served at, which the list's absences hold for.
	Done time.Time `json:"done,omitzero"`
	Code int       `json:"code,omitempty"`
}

// Snapshot is the end state, read in one go once the faults stopped.
type Snapshot struct {
	// Networks that exist, "namespace/name".
	Networks []string `json:"networks"`
	// Identities by network: their fabric IDs.
	Identities map[string]uint32 `json:"identities"`
	Claims     []SnapClaim       `json:"claims"`
	// QuotaLimit and QuotaUsed are the claims the platform may hold and
	// holds (units not yet given back count as held).
	QuotaLimit int `json:"quotaLimit"`
	QuotaUsed  int `json:"quotaUsed"`
}

// SnapClaim is a fabric-identity claim in a snapshot, with the reclaim
// policy its allocation recorded ("" when it has none).
type SnapClaim struct {
	Name     string `json:"name"`
	Network  string `json:"network"`
	Block    string `json:"block,omitempty"`
	Policy   string `json:"policy,omitempty"`
	Deleting bool   `json:"deleting,omitempty"`
}

// History is the run's record, kept as JSON lines (a failed run leaves the
// file behind).
type History = jsonlines.Log[Event]

// NewHistory writes a history to path.
func NewHistory(path string) (*History, error) {
	return jsonlines.Create(path, func(e *Event, now time.Time) {
		if e.T.IsZero() {
			e.T = now
		}
	})
}

// ReadHistory reads a history file back, to check it again.
func ReadHistory(path string) ([]Event, error) { return jsonlines.ReadFile[Event](path) }

// ParseRV reads a resourceVersion as etcd's revision. Kubernetes calls
// resourceVersions opaque; the harness compares them only within one API
// server backed by one etcd, where they are its revisions and only grow.
func ParseRV(rv string) uint64 {
	n, _ := strconv.ParseUint(rv, 10, 64)
	return n
}
