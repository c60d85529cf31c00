package nodeevents_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/nodeevents"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

// eventWrites counts the requests that write events, as the API server
// receives them.
type eventWrites struct {
	rt     http.RoundTripper
	writes atomic.Int64
}

func (c *eventWrites) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/events") && r.Method != http.MethodGet {
		c.writes.Add(1)
	}
	return c.rt.RoundTrip(r)
}

func recorder(t testing.TB, node string) (*nodeevents.Recorder, *eventWrites, kubernetes.Interface) {
	t.Helper()
	cluster := clustertest.Shared(t)
	counter := &eventWrites{}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst = 1000, 1000 // the count, not the client's rate limit, is measured
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.rt = rt; return counter }
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rec, err := nodeevents.New(ctx, cs, node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Shutdown(); cancel() })
	admin, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	return rec, counter, admin
}

func tapRef(vpc, att uint64, ifindex uint32) reclaim.TapRef {
	id := identity.Identity{VPC: identity.VPC(vpc), Attachment: identity.Attachment(att)}
	return reclaim.TapRef{Ifindex: ifindex, Name: id.TapName(), Owner: fmt.Sprintf("sandbox-%d", ifindex), Identity: id}
}

// nodeEvents lists the events regarding node with reason, through the
// events.k8s.io/v1 API.
func nodeEvents(t testing.TB, cs kubernetes.Interface, node, reason string) []eventsv1.Event {
	t.Helper()
	list, err := cs.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{
		FieldSelector: "reason=" + reason + ",regarding.name=" + node + ",regarding.kind=Node"})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never; last: %s", what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Each reclaim is one Event regarding the Node, the tap named in the
// reference's fieldPath and, with its identity and owner, in the note; the
// brake's engagement and release are Events too.
func TestEachActionIsAnEventRegardingTheNode(t *testing.T) {
	rec, _, cs := recorder(t, "node-events-each")
	tap := tapRef(10, 2, 41)
	rec.TapReclaimed(tap, time.Now().Add(-10*time.Minute))
	rec.TapReclaimFailed(reclaim.Failure{Tap: tapRef(10, 3, 42), Stage: reclaim.StageLink, Error: "delete link: EBUSY"})
	rec.BrakeEngaged(reclaim.Brake{Engaged: true, Reason: "3 of the node's 4 stamped taps found stale at once", Held: 3})
	rec.BrakeReleased("by an operator (allow mass removal)", 3)

	for reason, want := range map[string][]string{
		nodeevents.ReasonTapReclaimed:             {tap.Name, tap.Identity.String(), tap.Owner},
		nodeevents.ReasonTapReclaimFailed:         {tapRef(10, 3, 42).Name, "stage link", "EBUSY"},
		nodeevents.ReasonMassRemovalBrakeEngaged:  {"3 confirmed taps held", "3 of the node's 4"},
		nodeevents.ReasonMassRemovalBrakeReleased: {"by an operator", "3 candidates accepted"},
	} {
		eventually(t, reason, func() (bool, string) {
			evs := nodeEvents(t, cs, "node-events-each", reason)
			if len(evs) != 1 {
				return false, fmt.Sprintf("%d events", len(evs))
			}
			for _, w := range want {
				if !strings.Contains(evs[0].Note, w) {
					return false, fmt.Sprintf("note %q lacks %q", evs[0].Note, w)
				}
			}
			return evs[0].Regarding.UID == "node-events-each" && evs[0].ReportingController == nodeevents.Controller, fmt.Sprintf("%+v", evs[0].Regarding)
		})
	}
}

// 1,000 removals over 100 passes at the default cap of 10, beside one tap
// whose removal fails in every pass and a brake engaged and released each
// ten passes: one write per removal, and the repeats folded into series
// (tools/events patches a series at most every 30 minutes, and when it
// ends).
func TestEventWritesAreBoundedByTheRemovals(t *testing.T) {
	const removals = 1000
	w := recordRemovals(t, "node-events-bound", removals)
	t.Logf("%d event writes for %d removals, 100 failures of one tap and 10 brake cycles: %.3f writes per removal", w, removals, float64(w)/removals)
	// One per removal, plus, for each repeated kind (the failing tap, the
	// engagement, the release), a create and the patch that starts its
	// series, and a second create when that patch overtakes the first create
	// in flight: tools/events sends each write from a goroutine of its own
	// and answers a patch's NotFound with a create (recordEvent in
	// k8s.io/client-go/tools/events/event_broadcaster.go).
	if max := int64(removals + 3*3); w > max {
		t.Fatalf("%d event writes, want at most %d", w, max)
	}
}

// BenchmarkEventWritesPer1000Removals reports the API writes that 1,000
// removals cost in events, in the scene of
// TestEventWritesAreBoundedByTheRemovals, counted as the API server
// receives them; the peer is the removals themselves (one write each).
func BenchmarkEventWritesPer1000Removals(b *testing.B) {
	const removals = 1000
	var writes int64
	n := 0
	for b.Loop() {
		writes += recordRemovals(b, fmt.Sprintf("node-events-bench-%d", n), removals)
		n++
	}
	b.ReportMetric(float64(writes)/float64(n*removals), "api-writes/removal")
}

// recordRemovals records removals reclaims over passes of the default cap,
// one tap failing in every pass and a brake cycle each ten passes, waits
// until every reclaim is an Event and the failing tap is one series, and
// returns the event writes the API server received.
func recordRemovals(t testing.TB, node string, removals int) int64 {
	rec, writes, cs := recorder(t, node)
	const perPass = reclaim.DefaultMaxReclaimsPerPass
	failing := tapRef(11, 999999, 999999)
	for p := range removals / perPass {
		for i := range perPass {
			rec.TapReclaimed(tapRef(11, uint64(p*perPass+i+1), uint32(p*perPass+i+1)), time.Now())
		}
		rec.TapReclaimFailed(reclaim.Failure{Tap: failing, Stage: reclaim.StageProbe, Error: "probe: EBUSY"})
		if p%10 == 0 {
			rec.BrakeEngaged(reclaim.Brake{Engaged: true, Reason: "a mass", Held: 3})
			rec.BrakeReleased("on its own", 3)
		}
	}
	eventually(t, "every removal recorded", func() (bool, string) {
		n := len(nodeEvents(t, cs, node, nodeevents.ReasonTapReclaimed))
		return n == removals, fmt.Sprintf("%d of %d", n, removals)
	})
	time.Sleep(time.Second) // the series' writes, if any, land
	if n := len(nodeEvents(t, cs, node, nodeevents.ReasonTapReclaimFailed)); n != 1 {
		t.Fatalf("%d TapReclaimFailed events for one tap failing %d times, want one series", n, removals/perPass)
	}
	return writes.writes.Load()
}

// A note longer than the API server takes is cut, not lost: a failure's
// error can be of any length.
func TestALongNoteIsCutNotLost(t *testing.T) {
	rec, _, cs := recorder(t, "node-events-long")
	rec.TapReclaimFailed(reclaim.Failure{Tap: tapRef(12, 1, 1), Stage: reclaim.StageLink, Error: strings.Repeat("é%d", 2000)})
	eventually(t, "the long failure recorded", func() (bool, string) {
		evs := nodeEvents(t, cs, "node-events-long", nodeevents.ReasonTapReclaimFailed)
		if len(evs) != 1 {
			return false, fmt.Sprintf("%d events", len(evs))
		}
		return len(evs[0].Note) <= 1024 && strings.HasSuffix(evs[0].Note, "…"), evs[0].Note
	})
}
