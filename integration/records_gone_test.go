package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A network whose config was removed (its NetworkAttachmentDefinition
// deleted) never sees a CNI GC again, so the node daemon collects its
// records once their taps are gone: removed by the reclaim, or by hand. A
// live attachment's record and tap stay.
func TestTheDaemonCollectsRecordsOfTapsThatAreGone(t *testing.T) {
	h := newCNIHost(t)
	h.mustCNI("ADD", ctrA, h.conf("1", map[string]any{"name": "kept"}))
	h.mustCNI("ADD", ctrA, h.conf("2", map[string]any{"name": "gone"}))
	h.mustCNI("ADD", ctrA, h.conf("3", map[string]any{"name": "gone"}))
	h.host.IP(t, "link", "del", tapName("3")) // gone by hand
	record := func(network, att string) string { return filepath.Join(h.dataDir, network, tapName(att)) }
	for _, p := range []string{record("kept", "1"), record("gone", "2"), record("gone", "3")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("before: %v", err)
		}
	}

	n := newNodeOn(t, h.host, h.bpffs)
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment), // a/1 lives
		"--vrf-lock-dir", h.locks, "--cni-data-dir", h.dataDir)
	eventually(t, "the record of the tap removed by hand is collected at start", func() (bool, string) {
		_, err := os.Stat(record("gone", "3"))
		return os.IsNotExist(err), d.log.String()
	})
	// Two passes make a/2 stale and remove it; the collection after the
	// second removes its record and then its network's empty folder.
	for i := range 2 {
		if code, body := n.call("POST", "/v1/passes", adminToken); code != http.StatusOK {
			t.Fatalf("pass %d: %d %s", i+1, code, body)
		}
	}
	if _, ok := h.link(tapName("2")); ok {
		t.Fatal("the reclaim kept the gone network's tap")
	}
	eventually(t, "the gone network's folder is collected", func() (bool, string) {
		_, err := os.Stat(filepath.Join(h.dataDir, "gone"))
		return os.IsNotExist(err), d.log.String()
	})
	if _, err := os.Stat(record("kept", "1")); err != nil {
		t.Fatalf("the live attachment's record: %v", err)
	}
	if _, ok := h.link(tapName("1")); !ok {
		t.Fatal("the live attachment's tap is gone")
	}
	if !strings.Contains(d.log.String(), "collected a record that no longer speaks for a tap") {
		t.Fatalf("the daemon did not log what it collected:\n%s", d.log.String())
	}
}
