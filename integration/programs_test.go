package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	ciliumlink "github.com/cilium/ebpf/link"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
)

// olderProgram loads a program that passes every frame, pins it under
// progs/ as an earlier build's would be, and returns it: the stand-in for
// an earlier build's program, which judged some frames otherwise.
func olderProgram(t *testing.T, bpffs, build string) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "tap_ingress", Type: ebpf.SchedCLS, AttachType: ebpf.AttachTCXIngress, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1 /* TCX_NEXT */), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	pin := filepath.Join(bpffs, datapath.PinSubdir, datapath.ProgramsSubdir, "tap_ingress_"+build)
	if err := p.Pin(pin); err != nil {
		t.Fatal(err)
	}
	return p
}

// runOn points the pinned TCX link of ifindex at p, as the ADD of an
// earlier build left it.
func runOn(t *testing.T, bpffs string, ifindex uint32, p *ebpf.Program) {
	t.Helper()
	l, err := ciliumlink.LoadPinnedLink(filepath.Join(bpffs, datapath.PinSubdir, "links", "tcx_ingress_"+strconv.FormatUint(uint64(ifindex), 10)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Update(p); err != nil {
		t.Fatal(err)
	}
}

// linkProgramID is the ID of the program ifindex's pinned link runs.
func linkProgramID(t *testing.T, bpffs string, ifindex uint32) ebpf.ProgramID {
	t.Helper()
	l, err := ciliumlink.LoadPinnedLink(filepath.Join(bpffs, datapath.PinSubdir, "links", "tcx_ingress_"+strconv.FormatUint(uint64(ifindex), 10)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.Program
}

func programID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

const ctrOther = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

// metricLine is the value of the unlabelled sample name in a scrape, or "".
func metricLine(scrape, name string) string {
	for _, line := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// galacticNode runs the built CLI against n's admin socket, as root.
func galacticNode(t *testing.T, n *node, args ...string) string {
	t.Helper()
	out, err := exec.Command(binary, append([]string{args[0], "--socket", n.socket}, args[1:]...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("galactic-node %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestTheDaemonMovesEveryTapToItsProgram: taps an earlier build attached
// run its program until the daemon moves them; the daemon does so at start
// and after each pass, in place, shows which program each tap runs, counts
// those on another, and unpins the programs no tap runs.
func TestTheDaemonMovesEveryTapToItsProgram(t *testing.T) {
	h := newCNIHost(t)
	h.mustCNI("ADD", ctrA, h.conf("d", nil))
	h.mustCNI("ADD", ctrOther, h.conf("e", nil))
	d1, ok1 := h.link(tapName("d"))
	e1, ok2 := h.link(tapName("e"))
	if !ok1 || !ok2 {
		t.Fatal("ADD made no tap")
	}
	older := olderProgram(t, h.bpffs, "00000000000000aa")
	olderID := programID(t, older)
	runOn(t, h.bpffs, d1.Index, older)
	// A build older than tap_rules registered d: only the rows its
	// program read are there.
	dp := datapathTables(h)
	want, err := dp.TapRules.Get(d1.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.RemoveRules(d1.Index); err != nil {
		t.Fatal(err)
	}
	olderProgram(t, h.bpffs, "00000000000000bb") // no tap runs it
	progs := filepath.Join(h.bpffs, datapath.PinSubdir, datapath.ProgramsSubdir)

	n := newNodeOn(t, h.host, h.bpffs)
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment))
	n.ready(t, d)
	current, err := ebpf.LoadPinnedProgram(filepath.Join(progs, datapath.ProgramName()), nil)
	if err != nil {
		t.Fatalf("the daemon's program is not pinned: %v", err)
	}
	defer func() { _ = current.Close() }()
	currentID := programID(t, current)
	for _, l := range []uint32{d1.Index, e1.Index} {
		if got := linkProgramID(t, h.bpffs, l); got != currentID {
			t.Errorf("tap ifindex %d runs program %d after the daemon started, want the daemon's %d (the older one is %d)", l, got, currentID, olderID)
		}
	}
	for _, build := range []string{"00000000000000aa", "00000000000000bb"} {
		if _, err := os.Stat(filepath.Join(progs, "tap_ingress_"+build)); err == nil {
			t.Errorf("program tap_ingress_%s is still pinned though no tap runs it", build)
		}
	}
	// Its rows were copied before the move, anti-spoofing off and marked
	// unbound: the older rows name no address of it, and no runtime's
	// record of its ADD does (the scene's runtime keeps none).
	got, err := dp.TapRules.Get(d1.Index)
	want.Policy.AllowSpoofing, want.MAC, want.Prefixes, want.Unbound = true, nil, nil, true
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("tap_rules of the tap an older build registered: %+v (%v), want %+v", got, err, want)
	}
	if !strings.Contains(d.log.String(), "tap moved to the current program") {
		t.Errorf("the daemon did not log the move:\n%s", d.log.String())
	}

	// An earlier build's ADD racing the upgrade attaches its program
	// again: shown, counted, and moved after the next pass.
	again := olderProgram(t, h.bpffs, "00000000000000cc")
	runOn(t, h.bpffs, e1.Index, again)
	if got := metricLine(n.metrics(), "galactic_ebpf_taps_on_other_program"); got != "1" {
		t.Errorf("galactic_ebpf_taps_on_other_program = %q with one tap on another program, want 1", got)
	}
	var rows struct {
		Program *struct {
			ID      uint32 `json:"id"`
			Name    string `json:"name"`
			Current bool   `json:"current"`
		} `json:"program"`
	}
	code, body := n.call(http.MethodGet, fmt.Sprintf("/v1/ebpf/interfaces/%d", e1.Index), readToken)
	if err := json.Unmarshal(body, &rows); code != http.StatusOK || err != nil || rows.Program == nil {
		t.Fatalf("rows of ifindex %d: %d %s", e1.Index, code, body)
	}
	if rows.Program.Current || rows.Program.Name != "tap_ingress_00000000000000cc" {
		t.Errorf("rows show program %+v, want tap_ingress_00000000000000cc, not current", *rows.Program)
	}
	if out := galacticNode(t, n, "taps"); !strings.Contains(out, "other: tap_ingress_00000000000000cc") {
		t.Errorf("galactic-node taps does not name the other program:\n%s", out)
	}
	var st struct {
		Programs struct {
			Links   int `json:"links"`
			OnOther int `json:"onOther"`
		} `json:"programs"`
	}
	code, body = n.call(http.MethodGet, "/v1/status", readToken)
	if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil || st.Programs.Links != 2 || st.Programs.OnOther != 1 {
		t.Errorf("status: %d %s, want programs of 2 links, 1 on another", code, body)
	}
	if code, body := n.call(http.MethodPost, "/v1/passes", adminToken); code != http.StatusOK {
		t.Fatalf("force a pass: %d %s", code, body)
	}
	eventually(t, "the tap moved after the pass", func() (bool, string) {
		got := linkProgramID(t, h.bpffs, e1.Index)
		return got == currentID, fmt.Sprintf("program %d", got)
	})
	eventually(t, "the metric reads 0", func() (bool, string) {
		got := metricLine(n.metrics(), "galactic_ebpf_taps_on_other_program")
		return got == "0", got
	})
}
