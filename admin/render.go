package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/nodeview"
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
	}{withEmptyLists(t.items)})
}

// writeText renders v for a person at a terminal. Every cell and message
// goes through escapeText: a process name, a link alias or a tap name comes
// from whoever made it, and must not move the cursor, recolour the screen
// or start a row of its own.
func writeText(w io.Writer, v any) {
	switch v := v.(type) {
	case tabular:
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(escapeAll(v.header), "\t"))
		for _, r := range v.rows {
			fmt.Fprintln(tw, strings.Join(escapeAll(r), "\t"))
		}
		_ = tw.Flush()
	case errorBody:
		fmt.Fprintln(w, "error: "+escapeText(v.Error))
	case Status:
		WriteStatus(w, v, time.Now())
	case attachreg.InterfaceRows:
		writeInterfaceRows(w, v)
	default:
		b, _ := json.MarshalIndent(v, "", "  ")
		fmt.Fprintln(w, string(escapeJSON(b)))
	}
}

func escapeAll(cells []string) []string {
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = escapeText(c)
	}
	return out
}

// unsafeRune reports whether a terminal could act on r rather than show it:
// C0 and C1 controls, DEL, the bidirectional overrides and isolates (which
// reorder what follows), and the Unicode line and paragraph separators.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == '\u2028' || r == '\u2029'
}

// escapeText shows s with every unsafe rune, every byte that is not UTF-8,
// and the backslash itself as Go-style escapes (\x1b, \n, \u202e, \\), so
// that what is shown always reads back to what was there.
func escapeText(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || r == '\\' || unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x80 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// escapeJSON escapes, in JSON that encoding/json wrote, the unsafe runes it
// leaves raw (DEL, C1 controls, bidirectional controls) as \uXXXX: the same
// JSON value, safe on a terminal. encoding/json already escapes C0
// controls, U+2028 and U+2029, and replaces invalid UTF-8.
func escapeJSON(b []byte) []byte {
	if !bytes.ContainsFunc(b, func(r rune) bool { return r >= 0x7f && unsafeRune(r) }) {
		return b
	}
	var out bytes.Buffer
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r >= 0x7f && unsafeRune(r) {
			fmt.Fprintf(&out, `\u%04x`, r)
		} else {
			out.Write(b[:size])
		}
		b = b[size:]
	}
	return out.Bytes()
}

// WriteStatus renders GET /v1/status for a person: one "field: value" line
// each, times as ages and due times as of now.
func WriteStatus(w io.Writer, st Status, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, escapeText(v)) }
	line("version", st.Version)
	line("node", st.Node)
	if st.Ready {
		line("ready", "yes")
	} else {
		line("ready", "no: "+st.Reason)
	}
	line("dry run", strconv.FormatBool(st.Schedule.DryRun))
	switch {
	case st.Schedule.Interval == 0:
		line("passes", "only when forced (--interval 0)")
	case st.Schedule.NextDue.IsZero():
		line("passes", "every "+st.Schedule.Interval.String())
	default:
		line("passes", fmt.Sprintf("every %s, next in %s", st.Schedule.Interval, max(st.Schedule.NextDue.Sub(now), 0).Round(time.Second)))
	}
	switch b := st.Brake; {
	case b.Engaged && b.ReleasesAt.IsZero():
		line("mass-removal brake", fmt.Sprintf("ENGAGED %s ago, %d taps held: %s; release: galactic-node pass --allow-mass-removal",
			now.Sub(b.Since).Round(time.Second), b.Held, b.Reason))
	case b.Engaged:
		line("mass-removal brake", fmt.Sprintf("ENGAGED %s ago, %d taps held: %s; releases on its own in %s if the inventory shrinks no further, or: galactic-node pass --allow-mass-removal",
			now.Sub(b.Since).Round(time.Second), b.Held, b.Reason, max(b.ReleasesAt.Sub(now), 0).Round(time.Second)))
	case b.LastRelease != "":
		line("mass-removal brake", fmt.Sprintf("released %s ago %s", now.Sub(b.LastReleaseAt).Round(time.Second), b.LastRelease))
	default:
		line("mass-removal brake", "not engaged")
	}
	if b := st.Brake; b.MemoryError != "" {
		line("brake memory", "NOT SAVED: a restart now would forget the brake's last change: "+escapeText(b.MemoryError))
	}
	if r := st.Records; r != nil {
		recs := fmt.Sprintf("%d collected in the last round", r.Collected)
		if r.Kept > 0 {
			recs += fmt.Sprintf("; %d left unjudged: %s", r.Kept, escapeText(r.KeptWhy))
		}
		if r.Error != "" {
			recs += "; error: " + escapeText(r.Error)
		}
		line("cni records", recs)
	}
	if p := st.LastPass; p != nil {
		last := fmt.Sprintf("%s %s ago (took %s): %d reclaimed, %d failed", p.Result, now.Sub(p.Finished).Round(time.Second),
			p.Finished.Sub(p.Started).Round(time.Millisecond), p.Reclaimed, p.Failed)
		if p.DryRun {
			last += ", dry run"
		}
		if p.Reason != "" {
			last += ": " + p.Reason
		}
		line("last pass", last)
	} else {
		line("last pass", "none yet")
	}
	if !st.InventoryProvenAt.IsZero() {
		line("inventory", "proven current "+now.Sub(st.InventoryProvenAt).Round(time.Second).String()+" ago")
	} else {
		line("inventory", "a file: never proven against a cluster")
	}
	if st.HolderScan.Complete {
		line("holder names", "every process read")
	} else {
		line("holder names", "may miss holders ("+st.HolderScan.Reason+"); removals do not depend on them")
	}
	progs := fmt.Sprintf("%s (id %d): %d of %d attached taps run another", st.Programs.Current.Name, st.Programs.Current.ID, st.Programs.OnOther, st.Programs.Links)
	if st.Programs.Error != "" {
		progs += " (some links unreadable: " + escapeText(st.Programs.Error) + ")"
	}
	line("program", progs)
	switch {
	case st.Unbound.Error != "":
		line("unbound taps", "unreadable: "+escapeText(st.Unbound.Error))
	case st.Unbound.Count == 0:
		line("unbound taps", "none")
	default:
		line("unbound taps", fmt.Sprintf("%d run without anti-spoofing until an ADD binds them: %s", st.Unbound.Count, escapeText(strings.Join(st.Unbound.Taps, ", "))))
	}
	for _, m := range st.Maps {
		fill := "unreadable"
		switch {
		case m.Type == "Array" || m.Type == "PerCPUArray":
			fill = fmt.Sprintf("an array of %d slots, always full", m.MaxEntries)
		case m.Rows >= 0 && m.MaxEntries > 0:
			fill = fmt.Sprintf("%d/%d (%.1f%%)", m.Rows, m.MaxEntries, 100*float64(m.Rows)/float64(m.MaxEntries))
		}
		line("map "+m.Name, fill)
	}
	_ = tw.Flush()
}

// writeInterfaceRows renders one interface's rows as a table of map and
// row, the row as compact JSON: its fields differ from map to map.
func writeInterfaceRows(w io.Writer, v attachreg.InterfaceRows) {
	fmt.Fprintf(w, "ifindex %d, program attached: %t\n", v.Ifindex, v.Attached)
	if v.Program != nil {
		fmt.Fprintf(w, "program: %s\n", programText(v.Program))
	}
	names := make([]string, 0, len(v.Rows))
	for name := range v.Rows {
		names = append(names, name)
	}
	slices.Sort(names)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MAP\tROW")
	for _, name := range names {
		b, _ := json.Marshal(v.Rows[name])
		fmt.Fprintln(tw, escapeText(name)+"\t"+escapeText(string(b)))
	}
	_ = tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func tapRows(taps []nodeview.TapView) tabular {
	t := tabular{items: taps, header: []string{"NAME", "IFINDEX", "VPC", "ATT", "OWNER", "MASTER", "HELD", "HOLDERS", "CARRIED BY", "STATE", "PROGRAM", "DROPPED", "BOUND"}}
	for _, v := range taps {
		var holders, carried []string
		for _, h := range v.Holders {
			holders = append(holders, fmt.Sprintf("%d/%s", h.PID, h.Command))
		}
		for _, c := range v.CarriedBy {
			carried = append(carried, c.String())
		}
		if more := v.Carriers - len(v.CarriedBy); more > 0 {
			carried = append(carried, fmt.Sprintf("and %d more", more))
		}
		if v.CarriersUnknown != "" {
			carried = []string{"unknown"} // -o json says why
		}
		t.rows = append(t.rows, []string{v.Name, strconv.FormatUint(uint64(v.Ifindex), 10), v.VPC, v.Attachment, dash(v.Owner),
			dash(v.Master), strconv.FormatBool(v.Held), dash(strings.Join(holders, ",")), dash(strings.Join(carried, ",")), string(v.State),
			programText(v.Program), droppedText(v), boundText(v)})
	}
	return t
}

// boundText says whether anti-spoofing binds the tap to its attachment's
// MAC and addresses: "unbound" for a tap an older build made that no record
// of its ADD could bind.
func boundText(v nodeview.TapView) string {
	if v.Unbound {
		return "unbound"
	}
	return "yes"
}

// droppedText is how many of the tap's frames were dropped and why, the
// drops an operator looks for when a VM "has no network": "0", or
// "8 (spoofed 8)". "?" when the counters could not be read.
func droppedText(v nodeview.TapView) string {
	if v.Decisions == nil {
		return "?"
	}
	n := v.Dropped()
	if n == 0 {
		return "0"
	}
	var why []string
	for _, d := range []datapath.Decision{datapath.DecisionDeny, datapath.DecisionMalformed, datapath.DecisionSpoofed} {
		if c := v.Decisions[d]; c > 0 {
			why = append(why, fmt.Sprintf("%s %d", d, c))
		}
	}
	return fmt.Sprintf("%d (%s)", n, strings.Join(why, ", "))
}

// programText names the program a tap runs: "current", or the build that
// attached another ("other: tap_ingress_<hash> (id N)").
func programText(p *attachreg.Program) string {
	switch {
	case p == nil:
		return "-"
	case p.Current:
		return "current"
	case p.Name != "":
		return fmt.Sprintf("other: %s (id %d)", escapeText(p.Name), p.ID)
	default:
		return fmt.Sprintf("other: unpinned (id %d)", p.ID)
	}
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
		took := r.Finished.Sub(r.Started).Round(time.Microsecond).String()
		if r.Result == reclaim.ResultRunning {
			took = "running " + time.Since(r.Started).Round(time.Millisecond).String()
		}
		t.rows = append(t.rows, []string{r.Started.Format(time.RFC3339), took,
			string(r.Result), strconv.FormatBool(r.DryRun), strconv.Itoa(len(r.Candidates)), strconv.Itoa(len(r.Confirmed)),
			strconv.Itoa(len(r.Reclaimed)), strconv.Itoa(len(r.Failed)), dash(r.Reason)})
	}
	return t
}

func mapRows(maps []nodeview.MapView) tabular {
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
