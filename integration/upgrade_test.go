package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/internal/nettest"
)

// TestInstallCNIRefusesAPluginThatCannotWriteThePins runs the built
// install-cni over the pins and the layout record the built daemon left: a
// plugin of the same layout is installed, one of another is refused with
// the old plugin kept, so a rollout never leaves a node whose every ADD
// fails.
func TestInstallCNIRefusesAPluginThatCannotWriteThePins(t *testing.T) {
	bpffs := nettest.BPFFS(t)
	n := newNodeOn(t, nettest.NewNS(t), bpffs)
	record := filepath.Join(n.dir, "run", "datapath-layout")
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment), "--layout-record", record)
	n.ready(t, d)
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatalf("the daemon recorded no layout: %v", err)
	}
	if want, _ := datapath.PinnedLayout(); strings.TrimSpace(string(b)) != want {
		t.Fatalf("the daemon recorded layout %q, want this build's %q", b, want)
	}
	pins := filepath.Join(bpffs, datapath.PinSubdir)

	const older = "the plugin installed before"
	install := func(t *testing.T, pinDir, record string) (string, string, error) {
		t.Helper()
		netd, bin := hostCNIFolders(t, "")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bin, "galactic-tap"), []byte(older), 0o755); err != nil {
			t.Fatal(err)
		}
		log, err := installCNI(t, bin, netd, "--pin-dir", pinDir, "--layout-record", record)
		plugin, rerr := os.ReadFile(filepath.Join(bin, "galactic-tap"))
		if rerr != nil {
			t.Fatal(rerr)
		}
		return log, string(plugin), err
	}

	t.Run("pins of this layout", func(t *testing.T) {
		log, plugin, err := install(t, pins, record)
		if err != nil || plugin == older {
			t.Fatalf("install-cni over pins of its layout: %v, plugin replaced %t\n%s", err, plugin != older, log)
		}
	})
	t.Run("pins of another layout", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "datapath-layout")
		if err := os.WriteFile(other, []byte("v1-000000000000000000000000\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		log, plugin, err := install(t, pins, other)
		if err == nil {
			t.Fatalf("install-cni installed a plugin of another layout than the pins':\n%s", log)
		}
		if plugin != older {
			t.Error("the refused install replaced the plugin installed before")
		}
		for _, want := range []string{"another layout", pins, "v1-000000000000000000000000"} {
			if !strings.Contains(log, want) {
				t.Errorf("the refusal does not say %q:\n%s", want, log)
			}
		}
	})
	t.Run("pins no daemon recorded", func(t *testing.T) {
		log, plugin, err := install(t, pins, filepath.Join(t.TempDir(), "none"))
		if err != nil || plugin == older || !strings.Contains(log, "level=WARN") {
			t.Fatalf("install-cni over pins with no record: %v, plugin replaced %t, want installed with a warning\n%s", err, plugin != older, log)
		}
	})
	t.Run("no pins yet", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "datapath-layout")
		if err := os.WriteFile(other, []byte("v1-000000000000000000000000\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		log, plugin, err := install(t, filepath.Join(t.TempDir(), "galactic"), other)
		if err != nil || plugin == older {
			t.Fatalf("install-cni on a node with no pins: %v, plugin replaced %t\n%s", err, plugin != older, log)
		}
	})
}
