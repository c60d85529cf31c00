package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
)

// dataDirOnTmpfs gives h a data folder on a small tmpfs of its own, which
// a test can turn read-only or fill, as a node's disk does; it is unmounted
// when t ends.
func dataDirOnTmpfs(t *testing.T, h *cniHost) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=256k,mode=0700"); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	h.dataDir = dir
	return dir
}

// readOnly remounts the tmpfs at dir read-only.
func readOnly(t *testing.T, dir string) {
	t.Helper()
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
}

// fill fills the tmpfs at dir until a write answers ENOSPC.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, ".filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !strings.Contains(err.Error(), "no space") {
				t.Fatalf("fill %s: %v", dir, err)
			}
			return
		}
	}
}

// registrations is every interface the pinned maps hold rows for.
func registrations(t *testing.T, h *cniHost) []attachreg.Registered {
	t.Helper()
	dp, err := datapath.LoadPinned(h.bpffs)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	regs, err := attachreg.New(dp, nil, nil).Registered()
	if err != nil {
		t.Fatal(err)
	}
	return regs
}

// TestAnAddWhoseRecordCannotBeWrittenLeavesNothing: ADD records each
// attachment so that GC can find its tap; when the record cannot be
// written (a read-only or full data folder) the ADD fails, and then it must
// undo what it made: no tap, no rows, no pin.
func TestAnAddWhoseRecordCannotBeWrittenLeavesNothing(t *testing.T) {
	for _, how := range []string{"read-only", "full"} {
		t.Run(how, func(t *testing.T) {
			h := newCNIHost(t)
			dir := dataDirOnTmpfs(t, h)
			if how == "read-only" {
				readOnly(t, dir)
			} else {
				fill(t, dir)
			}
			r := newRuntime(t, h)
			list := r.list("1.1.0", "galactic", "4")
			err := r.in(func(ctx context.Context) error {
				_, err := r.cni.AddNetworkList(ctx, list, r.rt(ctrA, "eth0"))
				return err
			})
			if err == nil {
				t.Fatal("ADD succeeded with no record written")
			}
			if _, ok := h.link(tapName("4")); ok {
				t.Fatalf("the failed ADD (%v) left its tap", err)
			}
			if regs := registrations(t, h); len(regs) != 0 {
				t.Fatalf("the failed ADD (%v) left rows: %+v", err, regs)
			}
			pins, _ := filepath.Glob(filepath.Join(h.bpffs, datapath.PinSubdir, "links", "*"))
			if len(pins) != 0 {
				t.Fatalf("the failed ADD (%v) left TCX pins: %v", err, pins)
			}
		})
	}
}

// TestADelWithNothingToRemoveSucceedsOnAReadOnlyFolder: a runtime retries
// DEL until it succeeds, so a DEL whose tap is already gone must succeed
// even when the data folder is read-only, or the sandbox can never be
// removed. A DEL that removes the tap succeeds too; its record stays.
func TestADelWithNothingToRemoveSucceedsOnAReadOnlyFolder(t *testing.T) {
	h := newCNIHost(t)
	dir := dataDirOnTmpfs(t, h)
	r := newRuntime(t, h)
	gone, live := r.list("1.1.0", "galactic", "5"), r.list("1.1.0", "galactic", "6")
	ctrB := strings.Repeat("b", 64)
	err := r.in(func(ctx context.Context) error {
		if _, err := r.cni.AddNetworkList(ctx, gone, r.rt(ctrA, "eth0")); err != nil {
			return err
		}
		_, err := r.cni.AddNetworkList(ctx, live, r.rt(ctrB, "net1"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	h.host.IP(t, "link", "del", tapName("5"))
	readOnly(t, dir)
	for _, del := range []struct {
		list *libcni.NetworkConfigList
		rt   *libcni.RuntimeConf
	}{
		{gone, r.rt(ctrA, "eth0")}, // the tap gone, its record left
		{gone, r.rt(ctrA, "eth0")}, // the runtime's retry
		{r.list("1.1.0", "galactic", "x"), r.rt(strings.Repeat("c", 64), "eth0")}, // never added: no tap, no record
		{live, r.rt(ctrB, "net1")}, // a tap to remove, its record left
	} {
		if err := r.in(func(ctx context.Context) error { return r.cni.DelNetworkList(ctx, del.list, del.rt) }); err != nil {
			t.Fatalf("DEL of %s on a read-only folder: %v", del.rt.ContainerID[:1], err)
		}
	}
	if _, ok := h.link(tapName("6")); ok {
		t.Fatal("the DEL did not remove the live tap")
	}
}

// TestAnUnreadableRecordBlocksNeitherGCNorDel: a crash can leave a
// truncated record, and a person can garble one. It is moved aside and
// logged; GC still removes the taps of the attachments the runtime no
// longer lists, and keeps the one whose record it could not read.
func TestAnUnreadableRecordBlocksNeitherGCNorDel(t *testing.T) {
	h := newCNIHost(t)
	r := newRuntime(t, h)
	ctrs := map[string]string{"7": strings.Repeat("7", 64), "8": strings.Repeat("8", 64), "9": strings.Repeat("9", 64)}
	err := r.in(func(ctx context.Context) error {
		for att, ctr := range ctrs {
			if _, err := r.cni.AddNetworkList(ctx, r.list("1.1.0", "galactic", att), r.rt(ctr, "eth0")); err != nil {
				return fmt.Errorf("add %s: %w", att, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	garbled := filepath.Join(h.dataDir, "galactic", tapName("7"))
	if err := os.WriteFile(garbled, []byte(`{"tap":"G0`), 0o600); err != nil {
		t.Fatal(err)
	}
	// Only 9 is still valid: 8 goes, 7's record cannot say whose it is.
	err = r.in(func(ctx context.Context) error {
		return r.cni.GCNetworkList(ctx, r.list("1.1.0", "galactic", "9"), &libcni.GCArgs{
			ValidAttachments: []types.GCAttachment{{ContainerID: ctrs["9"], IfName: "eth0"}}})
	})
	if err != nil {
		t.Fatalf("GC with one unreadable record: %v", err)
	}
	if _, ok := h.link(tapName("8")); ok {
		t.Fatal("GC left the tap of an attachment the runtime no longer lists")
	}
	for _, att := range []string{"7", "9"} {
		if _, ok := h.link(tapName(att)); !ok {
			t.Fatalf("GC removed %s", tapName(att))
		}
	}
	if _, err := os.Stat(garbled); !os.IsNotExist(err) {
		t.Fatalf("the unreadable record is still in the way: %v", err)
	}
	aside, _ := filepath.Glob(filepath.Join(h.dataDir, "galactic", ".unreadable-*"))
	if len(aside) != 1 {
		t.Fatalf("the unreadable record was not kept aside for an operator: %v", aside)
	}
	// A DEL that carries no identity finds its taps through the records:
	// the unreadable one is out of the way, and 9's goes.
	h.mustCNI("DEL", ctrs["9"], h.conf("", map[string]any{"vpc": "", "vpcAttachment": ""}))
	if _, ok := h.link(tapName("9")); ok {
		t.Fatal("a DEL without identity left its tap beside an unreadable record")
	}
}
