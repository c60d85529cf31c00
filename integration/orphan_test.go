package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// pinnedRows counts, in every map pinned in the node's folder (not a list a
// package keeps), the rows keyed by ifindex, and says whether its TCX link
// is still pinned.
func (n *node) pinnedRows(ifindex string) (map[string]int, bool) {
	n.t.Helper()
	idx, err := strconv.ParseUint(ifindex, 10, 32)
	if err != nil {
		n.t.Fatal(err)
	}
	dir := filepath.Join(n.bpffs, datapath.PinSubdir)
	rows := nettest.PinnedRowsKeyedBy(n.t, dir, uint32(idx), counterMaps)
	_, err = os.Stat(filepath.Join(dir, "links", "tcx_ingress_"+ifindex))
	return rows, err == nil
}

// A registered tap deleted by something other than the daemon or CNI
// (here `ip link del`) leaves its five rows and its pinned TCX link: the
// built daemon's first pass finds them, a dry run reports them and removes
// none, and the next real pass clears every one, leaving the live tap's. A
// dry run's sighting counts for nothing: after two, the real pass only
// marks.
func TestRowsOfATapDeletedBehindTheNodesBackAreCollected(t *testing.T) {
	n := newNode(t)
	inv := n.writeInventory(liveAttachment)
	n.tapAdd("1", "sandbox-1")
	n.tapAdd("3", "sandbox-3")
	live, gone := n.ifindex("G00000000a001H"), n.ifindex("G00000000a003H")
	n.ns.IP(t, "link", "del", "G00000000a003H")
	if rows, pinned := n.pinnedRows(gone); len(rows) < 5 || !pinned {
		t.Fatalf("scene: rows %v pinned %v after ip link del; want the five maps and the pin", rows, pinned)
	}
	liveRows, _ := n.pinnedRows(live)

	_, log := n.start("--inventory-file", inv, "--admin-forces-per-minute", "60")
	n.waitReady(log)
	n.force("?dryRun=true")
	code, body := n.call("GET", "/v1/ebpf/maps", readToken)
	if code != 200 || !strings.Contains(string(body), `"orphans": 1`) {
		t.Fatalf("/v1/ebpf/maps after the first pass: %d %s", code, body)
	}
	code, body = n.call("POST", "/v1/passes?dryRun=true", adminToken)
	if code != 200 || strings.Contains(string(body), `"orphansWouldClear"`) || !strings.Contains(string(body), "orphaned interfaces seen once") {
		t.Fatalf("the first dry run's sighting counted, or the second does not say it records none: %d %s", code, body)
	}
	if code, body = n.call("POST", "/v1/passes", adminToken); code != 200 || strings.Contains(string(body), `"orphansCleared"`) {
		t.Fatalf("the first real pass after dry runs must only mark: %d %s", code, body)
	}
	code, body = n.call("POST", "/v1/passes?dryRun=true", adminToken)
	if code != 200 || !strings.Contains(string(body), `"orphansWouldClear"`) {
		t.Fatalf("the second dry run does not report what it would clear: %d %s", code, body)
	}
	if rows, pinned := n.pinnedRows(gone); len(rows) == 0 || !pinned {
		t.Fatalf("a dry run removed orphan rows: %v pinned %v", rows, pinned)
	}
	code, body = n.call("POST", "/v1/passes", adminToken)
	if code != 200 || !strings.Contains(string(body), `"orphansCleared"`) {
		t.Fatalf("the real pass: %d %s", code, body)
	}
	if rows, pinned := n.pinnedRows(gone); len(rows) != 0 || pinned {
		t.Fatalf("after the second pass: rows %v pinned %v, want none", rows, pinned)
	}
	if rows, pinned := n.pinnedRows(live); len(rows) != len(liveRows) || !pinned {
		t.Fatalf("the live tap's rows: %v pinned %v, want %v", rows, pinned, liveRows)
	}
	out := n.metrics()
	for _, want := range []string{
		`galactic_cni_orphan_ebpf_rows_removed_total{map="ifindex_vrf"} 1`,
		`galactic_cni_orphan_ebpf_rows_removed_total{map="tcx_link"} 1`,
		`galactic_ebpf_map_max_entries{map="ifindex_vrf"} 65536`,
		`galactic_ebpf_map_entries{map="ifindex_vrf"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// An orphan whose ifindex has a link again before the second pass is no
// orphan: its rows are kept.
func TestAnIfindexThatComesBackKeepsItsRows(t *testing.T) {
	n := newNode(t)
	inv := n.writeInventory(liveAttachment)
	n.tapAdd("3", "sandbox-3")
	gone := n.ifindex("G00000000a003H")
	n.ns.IP(t, "link", "del", "G00000000a003H")
	_, log := n.start("--inventory-file", inv)
	n.waitReady(log)
	n.force("")
	n.ns.IP(t, "link", "add", "back0", "index", gone, "type", "veth", "peer", "name", "back1")
	n.force("")
	n.force("")
	if rows, pinned := n.pinnedRows(gone); len(rows) < 5 || !pinned {
		t.Fatalf("rows of an ifindex that came back: %v pinned %v", rows, pinned)
	}
}

// CNI DEL after the tap was deleted behind its back clears what ADD
// registered: no row and no pin of that tap is left.
func TestDelAfterAnExternalDeleteLeavesNothing(t *testing.T) {
	h := newCNIHost(t)
	conf := h.conf("4", nil)
	h.mustCNI("ADD", ctrA, conf)
	l, ok := h.link(tapName("4"))
	if !ok || len(h.rows(l.Index)) < 5 {
		t.Fatalf("after ADD: %+v rows %v", l, h.rows(l.Index))
	}
	h.host.IP(t, "link", "del", tapName("4"))
	h.mustCNI("DEL", ctrA, conf)
	if rows := h.rows(l.Index); len(rows) != 0 {
		t.Fatalf("rows after DEL of a tap deleted behind its back: %v", rows)
	}
	pin := filepath.Join(h.bpffs, datapath.PinSubdir, "links", "tcx_ingress_"+strconv.Itoa(int(l.Index)))
	if _, err := os.Stat(pin); err == nil {
		t.Fatalf("the pin %s survived DEL", pin)
	}
}
