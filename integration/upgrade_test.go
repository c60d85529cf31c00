package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

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

// TestGCRemovesATapMadeBeforeRecordsOnceItsContainerIsGone: a plugin older
// than the records left taps no network recorded (here ADD's, with the
// record removed). The GC of the network whose configuration names a tap's
// identity records it while its container is listed, removes it once the
// container is not, keeps it while a process holds it, and leaves the
// unrecorded taps of other identities alone.
func TestGCRemovesATapMadeBeforeRecordsOnceItsContainerIsGone(t *testing.T) {
	h := newCNIHost(t)
	r := newRuntime(t, h)
	ctr := map[string]string{"7": strings.Repeat("7", 64), "8": strings.Repeat("8", 64), "9": strings.Repeat("9", 64)}
	nets := map[string]*libcni.NetworkConfigList{}
	for att, c := range ctr {
		nets[att] = r.list("1.1.0", "vm-"+att, att)
		// Not through libcni, whose GC would DEL the attachments it
		// cached: the taps of an older plugin are in no cache either.
		h.mustCNI("ADD", c, h.conf(att, map[string]any{"name": "vm-" + att}))
		if err := os.Remove(filepath.Join(h.dataDir, "vm-"+att, tapName(att))); err != nil {
			t.Fatalf("the record of %s: %v", tapName(att), err)
		}
	}
	nettest.Hold(t, h.host, tapName("9"), nettest.HoldOptions{Mode: tunMode()})
	gc := func(att string, valid ...string) {
		t.Helper()
		var list []types.GCAttachment
		for _, c := range valid {
			list = append(list, types.GCAttachment{ContainerID: c, IfName: "eth0"})
		}
		if err := r.in(func(ctx context.Context) error {
			return r.cni.GCNetworkList(ctx, nets[att], &libcni.GCArgs{ValidAttachments: list})
		}); err != nil {
			t.Fatalf("GC of vm-%s: %v", att, err)
		}
	}

	// Its container still listed: recorded, kept.
	gc("7", ctr["7"])
	if _, ok := h.link(tapName("7")); !ok {
		t.Fatal("GC removed a tap made before records whose container it lists")
	}
	if _, err := os.Stat(filepath.Join(h.dataDir, "vm-7", tapName("7"))); err != nil {
		t.Errorf("GC did not record the tap of a container it lists: %v", err)
	}
	// Its container gone: removed, and only it.
	gc("8")
	if _, ok := h.link(tapName("8")); ok {
		t.Fatal("GC left a tap made before records whose container is gone")
	}
	if _, ok := h.link(tapName("7")); !ok {
		t.Fatal("GC of vm-8 removed vm-7's tap")
	}
	// Held: kept, whatever the list says.
	gc("9")
	if _, ok := h.link(tapName("9")); !ok {
		t.Fatal("GC removed a held tap made before records")
	}
	// The adopted tap is an ordinary recorded one from then on.
	gc("7")
	if _, ok := h.link(tapName("7")); ok {
		t.Fatal("GC left the recorded tap once its container was gone")
	}
}
