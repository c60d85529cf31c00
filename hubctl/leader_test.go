package hubctl

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestLosingTheRaceToCreateTheLeaseIsNoError: replicas that start together
// race to create the Lease, and the e2e saw the loser log client-go's
// "Error initially creating lease lock" at error level on a loaded machine.
// A unit test of the sink, over a recording sink: the race itself cannot be
// staged on demand against a real API server.
func TestLosingTheRaceToCreateTheLeaseIsNoError(t *testing.T) {
	var lines []string
	rec := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	log := rec.WithSink(leaseRaceIsNoError{rec.GetSink()}).WithValues("lock", "platform/galactic-hubctl")
	lease := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

	log.Error(apierrors.NewAlreadyExists(lease, "galactic-hubctl"), "Error initially creating lease lock")
	log.Error(errors.New("connection refused"), "Error retrieving lease lock")

	if len(lines) != 2 {
		t.Fatalf("logged %q", lines)
	}
	if strings.Contains(lines[0], `"error"=`) || !strings.Contains(lines[0], "campaigning on") || !strings.Contains(lines[0], "platform/galactic-hubctl") {
		t.Errorf("the lost race logs %s, want an info line naming the lock", lines[0])
	}
	if !strings.Contains(lines[1], `"error"="connection refused"`) {
		t.Errorf("another failure logs %s, want it an error still", lines[1])
	}
}
