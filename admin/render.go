package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/agent"
	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// tabular is a list response: {"items": [...]} as JSON, an aligned table
// for Accept: text/plain.
type tabular struct {
	items  any
	header []string
	rows   [][]string
}

func (t tabular) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Items any `json:"items"`
	}{t.items})
}

func writeText(w io.Writer, v any) {
	switch v := v.(type) {
	case tabular:
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(v.header, "\t"))
		for _, r := range v.rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		_ = tw.Flush()
	case errorBody:
		fmt.Fprintln(w, "error: "+v.Error)
	default:
		b, _ := json.MarshalIndent(v, "", "  ")
		fmt.Fprintln(w, string(b))
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func tapRows(taps []agent.TapView) tabular {
	t := tabular{items: taps, header: []string{"NAME", "IFINDEX", "VPC", "ATT", "OWNER", "MASTER", "HELD", "HOLDERS", "CARRIED BY", "STATE"}}
	for _, v := range taps {
		var holders, carried []string
		for _, h := range v.Holders {
			holders = append(holders, fmt.Sprintf("%d/%s", h.PID, h.Command))
		}
		for _, c := range v.CarriedBy {
			carried = append(carried, c.String())
		}
		t.rows = append(t.rows, []string{v.Name, strconv.FormatUint(uint64(v.Ifindex), 10), v.VPC, v.Attachment, dash(v.Owner),
			dash(v.Master), strconv.FormatBool(v.Held), dash(strings.Join(holders, ",")), dash(strings.Join(carried, ",")), v.State})
	}
	return t
}

func pendingRows(p []reclaim.Pending) tabular {
	return pendingRowsAt(p, time.Now())
}

// pendingRowsAt renders p as of now: ELIGIBLE is when a pass may confirm
// the candidate, or "now" once that time has come.
func pendingRowsAt(p []reclaim.Pending, now time.Time) tabular {
	t := tabular{items: p, header: []string{"NAME", "IFINDEX", "OWNER", "IDENTITY", "FIRST SEEN", "ELIGIBLE", "PASSES"}}
	for _, c := range p {
		eligible := "now"
		if c.EligibleAt.After(now) {
			eligible = c.EligibleAt.Format(time.RFC3339)
		}
		t.rows = append(t.rows, []string{c.Tap.Name, strconv.FormatUint(uint64(c.Tap.Ifindex), 10), c.Tap.Owner,
			c.Tap.Identity.String(), c.FirstSeen.Format(time.RFC3339), eligible, strconv.Itoa(c.Passes)})
	}
	return t
}

func reportRows(reps []reclaim.Report) tabular {
	t := tabular{items: reps, header: []string{"STARTED", "DURATION", "RESULT", "DRY RUN", "CANDIDATES", "CONFIRMED", "RECLAIMED", "FAILED", "REASON"}}
	for _, r := range reps {
		t.rows = append(t.rows, []string{r.Started.Format(time.RFC3339), r.Finished.Sub(r.Started).Round(time.Microsecond).String(),
			r.Result, strconv.FormatBool(r.DryRun), strconv.Itoa(len(r.Candidates)), strconv.Itoa(len(r.Confirmed)),
			strconv.Itoa(len(r.Reclaimed)), strconv.Itoa(len(r.Failed)), dash(r.Reason)})
	}
	return t
}

func mapRows(maps []agent.MapView) tabular {
	t := tabular{items: maps, header: []string{"NAME", "TYPE", "KEY", "VALUE", "MAX", "ROWS", "ORPHANS", "PER INTERFACE"}}
	for _, m := range maps {
		t.rows = append(t.rows, []string{m.Name, m.Type, strconv.Itoa(int(m.KeySize)), strconv.Itoa(int(m.ValueSize)),
			strconv.Itoa(int(m.MaxEntries)), strconv.Itoa(m.Rows), strconv.Itoa(m.Orphans), strconv.FormatBool(m.PerInterface)})
	}
	return t
}

func rowRows(rows []datapath.Row[any, any]) tabular {
	t := tabular{items: rows, header: []string{"KEY", "VALUE"}}
	for _, r := range rows {
		k, _ := json.Marshal(r.Key)
		v, _ := json.Marshal(r.Value)
		t.rows = append(t.rows, []string{string(k), string(v)})
	}
	return t
}

func readAll(r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	return io.ReadAll(r.Body)
}
