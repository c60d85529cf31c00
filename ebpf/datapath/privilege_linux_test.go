package datapath_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// loadAsDaemonEnv names the bpffs a re-executed test binary loads into,
// holding only the daemon's capabilities.
const loadAsDaemonEnv = "GALACTICTEST_LOAD_AS_DAEMON"

// The DaemonSet grants CAP_BPF and CAP_NET_ADMIN only. Without CAP_PERFMON
// the verifier refuses packet pointer arithmetic by a variable offset and
// comparing a packet pointer with NULL, which full root never shows: the
// test binary re-executes itself with every other capability out of its
// bounding set (setpriv, util-linux) and loads the datapath there.
func TestTheDatapathLoadsWithOnlyBPFAndNetAdmin(t *testing.T) {
	if dir := os.Getenv(loadAsDaemonEnv); dir != "" {
		d, err := datapath.Load(dir)
		if err != nil {
			t.Fatalf("load with CAP_BPF and CAP_NET_ADMIN only: %+v", err)
		}
		d.Close()
		return
	}
	bpffs := nettest.BPFFS(t)
	cmd := exec.Command("setpriv", "--inh-caps=-all", "--bounding-set=-all,+bpf,+net_admin", "--",
		os.Args[0], "-test.run=^TestTheDatapathLoadsWithOnlyBPFAndNetAdmin$", "-test.v")
	cmd.Env = append(os.Environ(), loadAsDaemonEnv+"="+bpffs)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("the re-executed test ran nothing:\n%s", out)
	}
}
