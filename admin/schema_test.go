package admin

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// A report's nil lists are [] in its JSON, at any depth, and the report
// itself, shared with the reclaimer's history, is not written to.
func TestWithEmptyListsWritesEmptyListsAndCopies(t *testing.T) {
	rep := reclaim.Report{Started: time.Unix(1, 0).UTC(), Result: reclaim.ResultCompleted,
		Kept: []reclaim.Kept{{Why: "held"}}}
	b, err := json.Marshal(withEmptyLists(rep))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"candidates":[]`, `"confirmed":[]`, `"reclaimed":[]`, `"failed":[]`, `"started":"1970-01-01T00:00:01Z"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("no %s in %s", want, b)
		}
	}
	if strings.Contains(string(b), "null") {
		t.Errorf("a null in %s", b)
	}
	if rep.Candidates != nil || rep.Confirmed != nil {
		t.Error("withEmptyLists wrote to the report it was given")
	}
	// Through an interface and a pointer too, and a tabular's items.
	b, _ = json.Marshal(withEmptyLists(map[string]any{"p": &rep}))
	if strings.Contains(string(b), "null") {
		t.Errorf("a null in %s", b)
	}
	b, _ = json.Marshal(reportRows(nil))
	if string(b) != `{"items":[]}` {
		t.Errorf("no reports: %s", b)
	}
}
