package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// A daemon in a network namespace that is not the host's (a demo, a lab)
// sees other taps than the host's daemon: at the default layout record,
// CNI records folder and brake memory it would overwrite or remove the
// host daemon's. It must refuse to start, naming the flags to set, and
// write nothing.
func TestTheDaemonRefusesHostDefaultsOutsideTheHostsNamespace(t *testing.T) {
	ns := nettest.NewNS(t)
	dir := t.TempDir()
	inventory := filepath.Join(dir, "inventory.yaml")
	if err := os.WriteFile(inventory, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bpffs := filepath.Join(dir, "bpffs")
	if err := os.Mkdir(bpffs, 0o755); err != nil {
		t.Fatal(err)
	}
	nettest.Run(t, "mount", "-t", "bpf", "bpffs", bpffs)
	t.Cleanup(func() { _ = exec.Command("umount", bpffs).Run() })
	before := snapshot(t, hostState)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Private pins, locks and socket; the layout record, CNI records and
	// brake memory at their defaults.
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, binary, "run", "--node-name", "node-a",
		"--inventory-file", inventory, "--interval", "0", "--bpffs", bpffs, "--vrf-lock-dir", filepath.Join(dir, "locks"),
		"--admin-socket", filepath.Join(dir, "admin.sock"), "--metrics-listen", "", "--log-format", "text").CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the daemon started with the host's default paths outside the host's network namespace:\n%s", out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("exit: %v, want 2 (a usage mistake)\n%s", err, out)
	}
	for _, want := range []string{"not the host's", "--layout-record /run/galactic/datapath-layout", "--cni-data-dir /var/lib/cni/galactic-tap", "--brake-memory /var/lib/galactic/node/brake.json"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"--bpffs", "--vrf-lock-dir", "--admin-socket /"} {
		if strings.Contains(string(out), unwanted) {
			t.Errorf("the refusal names %q, which was given a path of its own:\n%s", unwanted, out)
		}
	}
	after := snapshot(t, hostState)
	for path, v := range after {
		if before[path] != v {
			t.Errorf("the refused daemon wrote %s", path)
		}
	}
}
