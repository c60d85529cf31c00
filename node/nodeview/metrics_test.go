package nodeview_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/nodeview"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// The frames the program judged but could not count against their tenant
// (the decisions map was full) are reported as a counter the overflow alert
// reads.
func TestDecisionsOverflowIsReported(t *testing.T) {
	dp, err := datapath.Load(nettest.BPFFS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	if err := dp.Unattributed.Put(datapath.ReasonDecisionsFull, 7); err != nil {
		t.Fatal(err)
	}
	views := &nodeview.Views{Datapath: dp}
	want := `
# HELP galactic_ebpf_decisions_overflow_total Frames judged but counted against no tenant because the decisions map was full (unattributed, reason decisions_full).
# TYPE galactic_ebpf_decisions_overflow_total counter
galactic_ebpf_decisions_overflow_total 7
`
	if err := testutil.CollectAndCompare(views.MapCollector(), strings.NewReader(want), "galactic_ebpf_decisions_overflow_total"); err != nil {
		t.Fatal(err)
	}
}
