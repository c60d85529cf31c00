package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/node/tun"
)

// cli runs the built binary's subcommand against n's daemon, as root on the
// node with no token, and returns its exit code and stdout and stderr.
func (n *node) cli(args ...string) (int, string) {
	n.t.Helper()
	// The socket goes before positional arguments: flags end at the first.
	out, err := exec.Command(binary, append([]string{args[0], "--socket", n.socket}, args[1:]...)...).CombinedOutput()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		n.t.Fatalf("galactic-node %v: %v", args, err)
	}
	return code, string(out)
}

// cliReport is what these tests read of `galactic-node pass -o json`.
type cliReport struct {
	Result     string `json:"result"`
	DryRun     bool   `json:"dryRun"`
	Preview    bool   `json:"preview"`
	Candidates []struct {
		Tap    struct{ Name string } `json:"tap"`
		Passes int                   `json:"passes"`
	} `json:"candidates"`
	Confirmed    []struct{ Name string } `json:"confirmed"`
	Held         []struct{ Name string } `json:"held"`
	WouldReclaim []struct{ Name string } `json:"wouldReclaim"`
	Reclaimed    []struct{ Name string } `json:"reclaimed"`
	NotDone      []string                `json:"notDone"`
	Brake        *struct {
		Engaged bool `json:"engaged"`
		Held    int  `json:"held"`
	} `json:"brake"`
}

func (n *node) cliPass(args ...string) cliReport {
	n.t.Helper()
	_, out := n.cli(append([]string{"pass", "-o", "json"}, args...)...)
	var rep cliReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		n.t.Fatalf("galactic-node pass %v -o json: %v:\n%s", args, err, out)
	}
	return rep
}

// staleTaps makes count free stamped taps whose identities nothing
// carries, from attachment 2 on, and returns their names.
func (n *node) staleTaps(count int) []string {
	n.t.Helper()
	var names []string
	for i := range count {
		name := fmt.Sprintf("G00000000a%03dH", i+2)
		n.stampedTap(name, fmt.Sprintf("sandbox-%d", i+2), tun.Mode{})
		names = append(names, name)
	}
	return names
}

// A braked pass confirmed every tap it held: its report lists them as
// confirmed, and as held, and both CLI views count them. On the base
// build it said "5 of the node's 5 stamped taps confirmed stale at once"
// next to CONFIRMED 0 and "confirmed": null.
func TestABrakedPassReportsTheTapsItConfirmedAndHeld(t *testing.T) {
	n := newNode(t)
	names := n.staleTaps(5)
	_, log := n.start("--inventory-file", n.writeInventory(liveAttachment), "--admin-forces-per-minute", "60")
	n.waitReady(log)
	n.force("")

	code, table := n.cli("pass")
	if code != exitNotDoneCode {
		t.Errorf("a braked pass exits %d, want %d:\n%s", code, exitNotDoneCode, table)
	}
	rows := strings.Split(table, "\n")
	// RESULT DRY RUN CANDIDATES CONFIRMED ...: the braked pass's own row.
	if len(rows) < 2 || !hasFields(rows[1], map[int]string{0: "completed", 3: "5"}) {
		t.Errorf("galactic-node pass of a braked pass does not count 5 confirmed:\n%s", table)
	}
	if !strings.Contains(table, "5 confirmed taps held") {
		t.Errorf("galactic-node pass does not say the 5 confirmed taps are held:\n%s", table)
	}

	rep := n.cliPass()
	if rep.Brake == nil || !rep.Brake.Engaged || rep.Brake.Held != 5 {
		t.Fatalf("the third pass is not braked holding 5: %+v", rep)
	}
	if len(rep.Confirmed) != 5 || len(rep.Held) != 5 || len(rep.Reclaimed) != 0 {
		t.Fatalf("a braked pass holding 5 reports %d confirmed, %d held, %d reclaimed; want 5, 5, 0: %+v",
			len(rep.Confirmed), len(rep.Held), len(rep.Reclaimed), rep)
	}
	for _, name := range names {
		if !n.exists(name) {
			t.Fatalf("%s removed through the brake", name)
		}
	}

	_, passes := n.cli("passes")
	lines := strings.Split(strings.TrimSpace(passes), "\n")
	// Newest first: the braked pass just forced.
	if len(lines) < 2 || !hasFields(lines[1], map[int]string{5: "5"}) {
		t.Errorf("galactic-node passes does not count the braked pass's 5 confirmed:\n%s", passes)
	}
	if m := n.metrics(); !strings.Contains(m, "galactic_cni_mass_removal_brake_held_taps 5") ||
		!strings.Contains(m, "galactic_cni_stale_taps_reclaimed_total 0") {
		t.Errorf("the metrics do not say 5 held and none reclaimed:\n%s", grepLines(m, "galactic_cni_", 40))
	}
}

// exitNotDoneCode is the CLI's exit code for a pass that did not complete
// what it meant to (a braked pass).
const exitNotDoneCode = 4

// hasFields reports whether row's whitespace-separated fields hold want,
// by position.
func hasFields(row string, want map[int]string) bool {
	f := strings.Fields(row)
	for i, w := range want {
		if i >= len(f) || f[i] != w {
			return false
		}
	}
	return true
}

// A dry run previews the real pass it stands for and leaves no trace a
// later pass decides by: two stale taps seen first by a dry run are not
// removed by the next real pass, which only starts their confirmation, as
// it would have without the dry run. The dry run says what it did not do.
// On the base build, the dry run reported WOULD RECLAIM 0, counted as
// their first sighting, and the next real pass removed both.
func TestADryRunIsAPreviewThatChangesNothing(t *testing.T) {
	n := newNode(t)
	names := n.staleTaps(2)
	_, log := n.start("--inventory-file", n.writeInventory(liveAttachment), "--admin-forces-per-minute", "60")
	n.waitReady(log)

	code, table := n.cli("pass", "--dry-run")
	if code != 0 || !strings.Contains(table, "2 seen once: a real pass now would start their confirmation") {
		t.Errorf("galactic-node pass --dry-run exits %d and does not say what a real pass would do:\n%s", code, table)
	}
	rep := n.cliPass("--dry-run")
	if !rep.DryRun || !rep.Preview || len(rep.Candidates) != 2 || rep.Candidates[0].Passes != 1 || len(rep.NotDone) == 0 {
		t.Errorf("a second dry run must still see two taps seen once, and say what it did not do: %+v", rep)
	}
	if _, pending := n.cli("pending"); strings.Contains(pending, names[0]) {
		t.Errorf("a dry run left candidates pending:\n%s", pending)
	}

	rep = n.cliPass()
	if len(rep.Reclaimed) != 0 || !n.exists(names[0]) || !n.exists(names[1]) {
		t.Fatalf("the first real pass after dry runs removed %v: the dry runs counted as a sighting", rep.Reclaimed)
	}
	if len(rep.Candidates) != 2 || rep.Candidates[0].Passes != 1 {
		t.Fatalf("the first real pass must see the taps for the first time: %+v", rep)
	}

	// Now the preview must say the real pass would remove both, and still
	// remove nothing.
	rep = n.cliPass("--dry-run")
	if len(rep.WouldReclaim) != 2 || len(rep.Reclaimed) != 0 || !n.exists(names[0]) {
		t.Fatalf("a dry run after a sighting: %+v", rep)
	}
	if _, table := n.cli("pass", "--dry-run"); !strings.Contains(table, "would reclaim "+names[0]) ||
		!strings.Contains(table, "a real pass now would remove 2") {
		t.Errorf("galactic-node pass --dry-run does not say a real pass would remove both:\n%s", table)
	}
	rep = n.cliPass()
	if len(rep.Reclaimed) != 2 || n.exists(names[0]) || n.exists(names[1]) {
		t.Fatalf("the second real pass: %+v", rep)
	}
}
