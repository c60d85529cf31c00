package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestADaemonKilledMidRemovalRestartsCleanly kills the daemon with SIGKILL
// after it deleted a stale tap's link and before it cleared the tap's rows
// (the test seam GALACTICTEST_HANG_AFTER_LINKS, compiled only into the
// daemon built with -tags galactic_testhooks, holds it there). The link
// goes first, so no tap is ever left existing without its rows and program;
// what is left is rows keyed by an ifindex no link has. A new daemon starts
// cleanly on the same pins, socket and locks and leaves the live tap alone.
func TestADaemonKilledMidRemovalRestartsCleanly(t *testing.T) {
	n := newNode(t)
	inv := filepath.Join(n.dir, "inventory.yaml")
	if err := os.WriteFile(inv, []byte("apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: live, namespace: t}\nstatus: {vpc: a, vpcAttachment: \"1\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n.tapAdd("1", "sandbox-1")
	n.tapAdd("3", "sandbox-3")
	live, stale := n.ifindex("G00000000a001H"), n.ifindex("G00000000a003H")
	marker := filepath.Join(n.dir, "links-deleted")

	t.Setenv("GALACTICTEST_HANG_AFTER_LINKS", marker)
	n.bin = hookedBinary // the seam exists only in a galactic_testhooks build
	first, log := n.start("--inventory-file", inv)
	n.waitReady(log)
	if code, body := n.call("POST", "/v1/passes", adminToken); code != 200 {
		t.Fatalf("pass 1: %d %s", code, body)
	}
	go n.callFresh("POST", "/v1/passes", adminToken) // hangs after deleting the link, then dies with the daemon
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
	if _, ok := n.linkGone("G00000000a003H"); !ok {
		t.Fatal("the stale tap exists although the daemon was killed after deleting its link")
	}

	t.Setenv("GALACTICTEST_HANG_AFTER_LINKS", "")
	n.bin = "" // the product daemon restarts
	_, log2 := n.start("--inventory-file", inv)
	n.waitReady(log2)
	code, body = n.call("GET", "/v1/ebpf/interfaces/"+live, readToken)
	if code != 200 || !strings.Contains(string(body), `"traffic_policy"`) || !strings.Contains(string(body), `"attached": true`) {
		t.Fatalf("the live tap's rows after the restart: %d %s", code, body)
	}
	code, body = n.call("GET", "/v1/ebpf/interfaces/"+stale, readToken)
	if code != 200 || !strings.Contains(string(body), `"traffic_policy"`) {
		t.Fatalf("the rows the kill left behind: %d %s", code, body)
	}
	for range 2 {
		if code, body := n.call("POST", "/v1/passes", adminToken); code != 200 {
			t.Fatalf("a pass of the restarted daemon: %d %s", code, body)
		}
	}
	if _, ok := n.linkGone("G00000000a001H"); ok {
		t.Fatal("the live tap was removed")
	}
}
