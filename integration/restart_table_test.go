package integration

import (
	"bytes"
	byteorder "encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/routewatch"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// docs/operations.md's restart table, row by row: the built daemon is
// SIGKILLed in each state, a new one started on the same host paths, and
// what the table says survives is checked, with what the first pass after
// the restart does.

// killed SIGKILLs d and waits for it, as the kernel's OOM killer or a
// liveness probe's restart leaves the node: no deferred step runs.
func killed(t *testing.T, d *daemon) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.done
}

// statusBrake is /v1/status's brake, as an operator reads it.
type statusBrake struct {
	Engaged     bool      `json:"engaged"`
	Since       time.Time `json:"since"`
	Reason      string    `json:"reason"`
	Held        int       `json:"held"`
	LastRelease string    `json:"lastRelease"`
}

func (n *node) statusBrake() statusBrake {
	n.t.Helper()
	code, body := n.call("GET", "/v1/status", readToken)
	var st struct{ Brake statusBrake }
	if err := json.Unmarshal(body, &st); code != 200 || err != nil {
		n.t.Fatalf("GET /v1/status: %d %v %s", code, err, body)
	}
	return st.Brake
}

func attachments(vpc string, atts ...string) []string {
	var docs []string
	for _, a := range atts {
		docs = append(docs, fmt.Sprintf("apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: %s-%s, namespace: t}\nstatus: {vpc: %q, vpcAttachment: %q}\n", vpc, a, vpc, a))
	}
	return docs
}

// Candidates live in the daemon only: after a restart the first pass marks
// afresh, so a tap seen stale once before the kill is removed no sooner
// than two passes after it.
func TestRestartCandidatesAreMarkedAfresh(t *testing.T) {
	n := newNode(t)
	inv := n.writeInventory(liveAttachment)
	const stale = "G00000000a002H"
	n.stampedTap(stale, "sandbox-2", tun.Mode{})
	d := n.run(t, "--inventory-file", inv)
	n.ready(t, d)
	if rep := n.force(""); len(rep.Reclaimed) != 0 {
		t.Fatalf("first pass removed %v", rep.Reclaimed)
	}
	killed(t, d)
	d = n.run(t, "--inventory-file", inv)
	n.ready(t, d)
	if rep := n.force(""); len(rep.Reclaimed) != 0 || !n.exists(stale) {
		t.Fatalf("the first pass after the restart removed %v: it must only mark", rep.Reclaimed)
	}
	if rep := n.force(""); len(rep.Reclaimed) != 1 {
		t.Fatalf("the second pass after the restart removed %v, want %s", rep.Reclaimed, stale)
	}
}

// The brake survives: engaged by the shrink rule alone (17 identities fell
// to 5 while 4 of the node's 8 taps went stale: half, so not the share
// rule), it is still engaged after a SIGKILL, with its reason and since, on
// /v1/status and the metric, and the restarted daemon removes nothing
// until an operator releases it. Without the brake's memory the restarted
// daemon removed the four taps.
func TestRestartTheBrakeStillHolds(t *testing.T) {
	n := newNode(t)
	var taps []string
	for i := 1; i <= 8; i++ {
		att := fmt.Sprint(i)
		name := fmt.Sprintf("G00000000a%03dH", i)
		n.stampedTap(name, "sandbox-"+att, tun.Mode{})
		taps = append(taps, name)
	}
	others := attachments("b", "1", "2", "3", "4", "5", "6", "7", "8", "9")
	inv := n.writeInventory(append(attachments("a", "1", "2", "3", "4", "5", "6", "7", "8"), others...)...)
	d := n.run(t, "--inventory-file", inv)
	n.ready(t, d)
	n.force("")
	n.writeInventory(append(attachments("a", "5", "6", "7", "8"), others[0])...) // 17 to 5
	n.force("")
	if rep := n.force(""); len(rep.Reclaimed) != 0 {
		t.Fatalf("the shrink removed %v", rep.Reclaimed)
	}
	before := n.statusBrake()
	if !before.Engaged || !strings.Contains(before.Reason, "fell from 17 to 5") {
		t.Fatalf("brake %+v, want engaged by the shrink rule", before)
	}

	killed(t, d)
	d = n.run(t, "--inventory-file", inv)
	n.ready(t, d)
	after := n.statusBrake()
	if !after.Engaged || after.Reason != before.Reason || !after.Since.Equal(before.Since) || after.Held != before.Held {
		t.Fatalf("after the restart the brake is %+v, want %+v", after, before)
	}
	if m := n.metrics(); !strings.Contains(m, "galactic_cni_mass_removal_brake_engaged 1") || !strings.Contains(m, "galactic_cni_mass_removal_brake_held_taps 4") {
		t.Fatal("after the restart the brake's metrics do not say engaged, 4 held")
	}
	for i := range 3 {
		if rep := n.force(""); len(rep.Reclaimed) != 0 {
			t.Fatalf("pass %d after the restart removed %v", i+1, rep.Reclaimed)
		}
	}
	for _, name := range taps {
		if !n.exists(name) {
			t.Fatalf("%s removed while the brake held", name)
		}
	}

	// The release, as an operator runs it, survives the next kill too.
	out, err := exec.Command("ip", "netns", "exec", n.ns.Name, binary, "pass", "--allow-mass-removal", "--socket", n.socket).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "mass-removal brake released") {
		t.Fatalf("release: %v\n%s", err, out)
	}
	for _, name := range taps[:4] {
		if n.exists(name) {
			t.Fatalf("%s kept after the release", name)
		}
	}
	killed(t, d)
	d = n.run(t, "--inventory-file", inv)
	n.ready(t, d)
	if b := n.statusBrake(); b.Engaged || !strings.Contains(b.LastRelease, "by an operator") {
		t.Fatalf("after the release and a restart: %+v", b)
	}
}

// A brake memory that cannot be read is moved aside, and the daemon starts
// with the brake engaged, saying why: it cannot tell whether the brake held.
func TestRestartAnUnreadableBrakeMemoryEngagesTheBrake(t *testing.T) {
	n := newNode(t)
	memory := filepath.Join(n.dir, "brake.json")
	if err := os.WriteFile(memory, []byte(`{"version":1,"memory":{"brake":{"engaged":tr`), 0o600); err != nil {
		t.Fatal(err)
	}
	n.stampedTap("G00000000a002H", "sandbox-2", tun.Mode{})
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment), "--brake-memory", memory)
	n.ready(t, d)
	b := n.statusBrake()
	if !b.Engaged || !strings.Contains(b.Reason, "could not be read") || !strings.Contains(b.Reason, memory+".unreadable-") {
		t.Fatalf("brake %+v, want engaged, naming the file moved aside", b)
	}
	if aside, _ := filepath.Glob(memory + ".unreadable-*"); len(aside) != 1 {
		t.Fatalf("moved aside: %v", aside)
	}
	n.force("")
	if rep := n.force(""); len(rep.Reclaimed) != 0 {
		t.Fatalf("removed %v while the brake held", rep.Reclaimed)
	}
}

// The layout record (in /run: a reboot clears it, with the pins) is
// written at start, so a killed daemon's record stays valid and the next
// start writes the same.
func TestRestartTheLayoutRecordStays(t *testing.T) {
	n := newNode(t)
	record := filepath.Join(n.dir, "run", "datapath-layout")
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment), "--layout-record", record)
	n.ready(t, d)
	first, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	killed(t, d)
	if now, err := os.ReadFile(record); err != nil || !bytes.Equal(now, first) {
		t.Fatalf("the record after the kill: %v", err)
	}
	d = n.run(t, "--inventory-file", n.writeInventory(liveAttachment), "--layout-record", record)
	n.ready(t, d)
	if now, err := os.ReadFile(record); err != nil || !bytes.Equal(now, first) {
		t.Fatalf("the record after the restart differs: %v", err)
	}
}

// CNI records are on disk: a kill loses none, and the restarted daemon's
// collection removes the record of a tap gone meanwhile and keeps the
// live one's.
func TestRestartTheCNIRecordsAreCollectedAtStart(t *testing.T) {
	n := newNode(t)
	data := filepath.Join(n.dir, "cni")
	n.tapAdd("1", "sandbox-1")
	n.tapAdd("2", "sandbox-2")
	for _, att := range []string{"1", "2"} {
		dir := filepath.Join(data, "galactic")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		tap := "G00000000a00" + att + "H"
		rec := fmt.Sprintf(`{"tap":%q,"containerID":"sandbox-%s","ifName":"net1"}`, tap, att)
		if err := os.WriteFile(filepath.Join(dir, tap), []byte(rec), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	inv := n.writeInventory(liveAttachment)
	d := n.run(t, "--inventory-file", inv, "--cni-data-dir", data)
	n.ready(t, d)
	killed(t, d)
	n.ns.IP(t, "link", "del", "G00000000a002H") // gone while no daemon ran
	d = n.run(t, "--inventory-file", inv, "--cni-data-dir", data)
	n.ready(t, d)
	eventually(t, "the gone tap's record collected at start", func() (bool, string) {
		_, err := os.Stat(filepath.Join(data, "galactic", "G00000000a002H"))
		return os.IsNotExist(err), d.log.String()
	})
	if _, err := os.Stat(filepath.Join(data, "galactic", "G00000000a001H")); err != nil {
		t.Fatalf("the live tap's record: %v", err)
	}
}

// The pins (bpffs; a reboot clears them, and the taps with them) carry a
// live tap's rows and program through a kill: the tap keeps its policy
// while no daemon runs, and the restarted daemon serves the same rows.
func TestRestartThePinsKeepALiveTapsRows(t *testing.T) {
	n := newNode(t)
	n.tapAdd("1", "sandbox-1")
	ifindex := n.ifindex("G00000000a001H")
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment))
	n.ready(t, d)
	_, before := n.call("GET", "/v1/ebpf/interfaces/"+ifindex, readToken)
	killed(t, d)
	d = n.run(t, "--inventory-file", n.writeInventory(liveAttachment))
	n.ready(t, d)
	code, after := n.call("GET", "/v1/ebpf/interfaces/"+ifindex, readToken)
	if code != 200 || !bytes.Equal(before, after) || !strings.Contains(string(after), `"attached": true`) {
		t.Fatalf("the live tap's rows after the restart: %d\n%s\nbefore:\n%s", code, after, before)
	}
	n.force("")
	if rep := n.force(""); len(rep.Reclaimed) != 0 {
		t.Fatalf("the restarted daemon removed %v", rep.Reclaimed)
	}
}

// The host view is not revoked by a kill (no step runs), so it lapses on
// its own within routewatch.ViewTrust, after which the program asks the
// route lookup; the restarted daemon publishes it again.
func TestRestartTheHostViewLapsesAndIsPublishedAgain(t *testing.T) {
	n := newNode(t)
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment))
	n.ready(t, d)
	view, err := ebpf.LoadPinnedMap(filepath.Join(n.bpffs, datapath.PinSubdir, datapath.StateSubdir, "host_view"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	left := func() time.Duration {
		var v [16]byte
		if err := view.Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
		return time.Duration(byteorder.NativeEndian.Uint64(v[:8])) - time.Duration(ts.Nano())
	}
	eventually(t, "the view published", func() (bool, string) { l := left(); return l > 0, l.String() })
	killed(t, d)
	if l := left(); l > routewatch.ViewTrust {
		t.Fatalf("a killed daemon's view is trusted for %v more, beyond ViewTrust %v", l, routewatch.ViewTrust)
	}
	time.Sleep(routewatch.ViewTrust)
	if l := left(); l > 0 {
		t.Fatalf("the killed daemon's view still trusted %v after ViewTrust", l)
	}
	d = n.run(t, "--inventory-file", n.writeInventory(liveAttachment))
	n.ready(t, d)
	eventually(t, "the restarted daemon publishes the view", func() (bool, string) { l := left(); return l > 0, l.String() })
}

// A daemon started in a network namespace of its own, beside the CNI
// records of live taps in another (a lab, a second daemon, `make demo` at
// the default --cni-data-dir), sees none of their taps: it must remove none
// of their records, and say why in /v1/status. Records of this build name
// their namespace; an older record without it is judged only where its VRF
// is seen.
func TestADaemonInAnotherNamespaceRemovesNoRecord(t *testing.T) {
	host := newNode(t) // where the taps live
	host.tapAdd("1", "sandbox-1")
	host.tapAdd("2", "sandbox-2")
	hostNS := strings.TrimSpace(nettest.Run(t, "ip", "netns", "exec", host.ns.Name, "readlink", "/proc/self/ns/net"))
	data := filepath.Join(host.dir, "cni")
	dir := filepath.Join(data, "galactic")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	records := map[string]string{
		"G00000000a001H": fmt.Sprintf(`{"tap":"G00000000a001H","containerID":"sandbox-1","ifName":"net1","hostNetns":%q}`, hostNS),
		"G00000000a002H": `{"tap":"G00000000a002H","containerID":"sandbox-2","ifName":"net1"}`, // an older plugin's
	}
	for name, rec := range records {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(rec), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	elsewhere := newNode(t)
	d := elsewhere.run(t, "--inventory-file", elsewhere.writeInventory(liveAttachment), "--cni-data-dir", data)
	elsewhere.ready(t, d)
	var st struct {
		Records struct {
			Collected int    `json:"collected"`
			Kept      int    `json:"kept"`
			KeptWhy   string `json:"keptWhy"`
		} `json:"records"`
	}
	eventually(t, "the collection at start reported", func() (bool, string) {
		_, body := elsewhere.call("GET", "/v1/status", readToken)
		if err := json.Unmarshal(body, &st); err != nil {
			return false, string(body)
		}
		return st.Records.Kept == 2, string(body)
	})
	if st.Records.Collected != 0 || !strings.Contains(st.Records.KeptWhy, hostNS) {
		t.Fatalf("records status %+v, want none collected and the records' namespace named", st.Records)
	}
	for range 2 {
		elsewhere.force("") // each pass is followed by a collection
	}
	for name := range records {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("the record of live tap %s: %v\n%s", name, err, d.log)
		}
	}
}
