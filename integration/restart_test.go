package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestADaemonKilledMidRemovalRestartsAndReclaimsLater kills the daemon with
// SIGKILL after it cleared a stale tap's rows and before it removed the
// link (the test seam GALACTIC_TEST_HANG_AFTER_ROWS holds it there). The
// tap survives without rows; a new daemon starts cleanly on the same pins,
// socket and locks, and its own two passes reclaim the tap.
func TestADaemonKilledMidRemovalRestartsAndReclaimsLater(t *testing.T) {
	n := newNode(t)
	inv := filepath.Join(n.dir, "inventory.yaml")
	if err := os.WriteFile(inv, []byte("apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: live, namespace: t}\nstatus: {vpc: a, vpcAttachment: \"1\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n.tapAdd("1", "sandbox-1")
	n.tapAdd("3", "sandbox-3")
	stale := n.ifindex("G00000000a003H")
	marker := filepath.Join(n.dir, "rows-cleared")

	t.Setenv("GALACTIC_TEST_HANG_AFTER_ROWS", marker)
	first, log := n.start("--inventory-file", inv)
	n.waitReady(log)
	if code, body := n.call("POST", "/v1/passes", adminToken); code != 200 {
		t.Fatalf("pass 1: %d %s", code, body)
	}
	go n.callFresh("POST", "/v1/passes", adminToken) // hangs after clearing rows, then dies with the daemon
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the removal never reached the seam:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()

	code, body := n.callFresh("GET", "/v1/ebpf/interfaces/"+stale, readToken)
	if code != 0 {
		t.Fatalf("the killed daemon still answers: %d %s", code, body)
	}
	if n.ifindex("G00000000a003H") != stale {
		t.Fatal("the tap is gone although the daemon was killed before removing its link")
	}

	t.Setenv("GALACTIC_TEST_HANG_AFTER_ROWS", "")
	_, log2 := n.start("--inventory-file", inv)
	n.waitReady(log2)
	code, body = n.call("GET", "/v1/ebpf/interfaces/"+stale, readToken)
	if code != 200 || !strings.Contains(string(body), `"rows": {}`) {
		t.Fatalf("rows after the kill: %d %s", code, body)
	}
	n.call("POST", "/v1/passes", adminToken)
	code, body = n.call("POST", "/v1/passes", adminToken)
	if code != 200 || !strings.Contains(string(body), `"G00000000a003H"`) || !strings.Contains(string(body), `"reclaimed": [`) {
		t.Fatalf("the restarted daemon's second pass: %d %s", code, body)
	}
	if _, ok := n.linkGone("G00000000a003H"); !ok {
		t.Fatal("the tap survived the restarted daemon's passes")
	}
	if _, ok := n.linkGone("G00000000a001H"); ok {
		t.Fatal("the live tap was removed")
	}
}
