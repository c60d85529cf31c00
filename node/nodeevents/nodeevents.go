// Package nodeevents records what the node's reclaim does as Kubernetes
// Events (events.k8s.io/v1), regarding the Node, so that `kubectl get
// events` and `kubectl describe node` show a reclaim, a failed one and the
// mass-removal brake beside the kubelet's own events. It implements
// reclaim.Recorder.
//
// Events go through client-go's tools/events, asynchronously: a call
// returns at once, the broadcaster's queue drops what it cannot hold, and a
// write that fails is retried by the broadcaster and then dropped. Nothing
// here can fail or delay a removal.
//
// tools/events folds events with the same type, reason, action, reporter
// and regarding reference into one Event with a series count. A tap is a
// part of the node, named in the reference's fieldPath (taps{<name>}), as
// the kubelet names a container of a pod (spec.containers{<name>}): two
// taps reclaimed make two Events, and one tap whose removal fails pass
// after pass makes one Event whose series counts the passes.
package nodeevents

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// Event reasons, as `kubectl get events --field-selector reason=…` finds them.
const (
	ReasonTapReclaimed             = "TapReclaimed"
	ReasonTapReclaimFailed         = "TapReclaimFailed"
	ReasonMassRemovalBrakeEngaged  = "MassRemovalBrakeEngaged"
	ReasonMassRemovalBrakeReleased = "MassRemovalBrakeReleased"
)

// Actions, the machine-readable verb of each event.
const (
	actionReclaim = "Reclaim"
	actionBrake   = "Brake"
	actionRelease = "Release"
)

// Controller is the reporting controller the node's events carry.
const Controller = "galactic.datum.net/galactic-node"

// Recorder records the reclaim's events regarding one Node.
type Recorder struct {
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
	node        string
}

var _ reclaim.Recorder = (*Recorder)(nil)

// New starts recording to the API server through cs, regarding node, until
// ctx ends or Shutdown is called. The reporting instance is the
// controller's name and the host's (tools/events').
func New(ctx context.Context, cs kubernetes.Interface, node string) (*Recorder, error) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, fmt.Errorf("start recording events: %w", err)
	}
	return &Recorder{broadcaster: b, recorder: b.NewRecorder(scheme.Scheme, Controller), node: node}, nil
}

// Shutdown stops recording; events queued and not yet written are lost.
func (r *Recorder) Shutdown() { r.broadcaster.Shutdown() }

// nodeRef is the Node as the kubelet references it in its events: the UID
// is the node's name, which `kubectl describe node` also looks events up
// by. part names a part of the node in fieldPath, or "" for the node.
func (r *Recorder) nodeRef(part string) *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: r.node, UID: types.UID(r.node), FieldPath: part}
}

func tapPart(name string) string { return "taps{" + name + "}" }

// TapReclaimed implements reclaim.Recorder.
func (r *Recorder) TapReclaimed(t reclaim.TapRef, firstSeen time.Time) {
	r.event(tapPart(t.Name), corev1.EventTypeNormal, ReasonTapReclaimed, actionReclaim,
		"Reclaimed tap %s (ifindex %d, owner %s, identity %s): nothing held it and no VPCAttachment or BGPAdvertisement carried its identity since %s",
		t.Name, t.Ifindex, t.Owner, t.Identity, firstSeen.UTC().Format(time.RFC3339))
}

// TapReclaimFailed implements reclaim.Recorder.
func (r *Recorder) TapReclaimFailed(f reclaim.Failure) {
	r.event(tapPart(f.Tap.Name), corev1.EventTypeWarning, ReasonTapReclaimFailed, actionReclaim,
		"Reclaim of tap %s (ifindex %d, owner %s, identity %s) failed at stage %s, retried by a later pass: %s",
		f.Tap.Name, f.Tap.Ifindex, f.Tap.Owner, f.Tap.Identity, f.Stage, f.Error)
}

// BrakeEngaged implements reclaim.Recorder.
func (r *Recorder) BrakeEngaged(b reclaim.Brake) {
	release := "only `galactic-node pass --allow-mass-removal` on the node releases it"
	if !b.ReleasesAt.IsZero() {
		release = fmt.Sprintf("it releases on its own at %s if the inventory shrinks no further, or: galactic-node pass --allow-mass-removal", b.ReleasesAt.UTC().Format(time.RFC3339))
	}
	r.event("", corev1.EventTypeWarning, ReasonMassRemovalBrakeEngaged, actionBrake,
		"Mass-removal brake engaged, passes remove nothing (%d confirmed taps held): %s; %s", b.Held, b.Reason, release)
}

// BrakeReleased implements reclaim.Recorder.
func (r *Recorder) BrakeReleased(how string, accepted int) {
	r.event("", corev1.EventTypeNormal, ReasonMassRemovalBrakeReleased, actionRelease,
		"Mass-removal brake released %s; %d candidates accepted, removed at the per-pass cap's pace", how, accepted)
}

// maxNote is events.k8s.io/v1's limit on a note (NoteLengthLimit): the API
// server refuses a longer one, and the event would be lost. Errors and
// reasons quoted in a note can be of any length.
const maxNote = 1024

// event records a note about the node, or a part of it, cut to maxNote.
func (r *Recorder) event(part, typ, reason, action, format string, args ...any) {
	note := fmt.Sprintf(format, args...)
	if len(note) > maxNote {
		cut := maxNote - len("…")
		for cut > 0 && !utf8.RuneStart(note[cut]) {
			cut--
		}
		note = note[:cut] + "…"
	}
	// The note is passed as an argument, never as a format: a % in an
	// error must not be read as a verb.
	r.recorder.Eventf(r.nodeRef(part), nil, typ, reason, action, "%s", note)
}
